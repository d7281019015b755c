"""One engine cycle: plan, diff against Slurm, guardrails, writes, reverts, memory."""
