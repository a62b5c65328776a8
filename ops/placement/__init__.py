"""Queue-aware placement: Slurm `--test-only` probes, a placement plan and a queue-model simulator.

    ops probe --config examples/run.toml --site lumi
    ops place --config examples/run.toml
    scripts/queue_model

Modules: `config` (the `[sites.NAME.slurm]` and `[placement]` tables of the run file), `slurm`
(the per-site adaptor and the `--test-only` parser), `predictions` (the prediction log and its
calibration), `probing` (one site's probes, logged and calibrated), `timeline` (time-to-target of
elastic and gang-scheduled training), `plan` (the planner), `templates` (sbatch scripts),
`queue_model` (the simulator), `commands` (the CLI).
"""
