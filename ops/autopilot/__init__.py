"""`ops autopilot`: the operator loop that keeps every site's next Slurm job queued (issue 35)."""
