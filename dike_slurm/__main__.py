from dike_slurm.cli import main

main()
