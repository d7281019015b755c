"""What a policy sees and decides: the cluster model, the decisions, the job fields, Slurm's priority model."""
