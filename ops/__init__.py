"""sitemesh operations: commands that talk to running peers, Slurm and simulators."""
