"""The sbatch templates in scripts/slurm/ are valid batch scripts for a real Slurm (`--test-only`),
filled with the example run file's parameters; the slow test runs one and checks that the peer
gets SIGTERM before the wall-time ends; another runs a real peer whose trainer ranks fill the job
(srun)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from ops.placement import config, templates
from ops.placement.config import JobShape
from ops.placement.slurm import SlurmSite
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
LOCAL = JobShape(nodes=1, time_s=300, partition="debug")  # no GPUs, account or QOS on the test cluster


@pytest.mark.parametrize("site", ["snellius", "lumi", "frontier"])
def test_template_passes_test_only(slurm: SlurmCluster, site: str) -> None:
    run = config.load(REPO / "examples/run.toml")
    # The test node has 2 CPUs and no GPUs: a shape of "2 GPUs" per node asks for 2 tasks per node.
    s = dataclasses.replace(run.sites[site], shape=dataclasses.replace(run.sites[site].shape, gpus_per_node=2))
    script = templates.render(s, run.path)
    assert f"#SBATCH --signal=B:TERM@{s.params.signal_seconds}" in script
    assert f"--site {site}" in script
    # Every GPU of every node gets a task (a trainer rank), and the one peer starts them with srun.
    assert "#SBATCH --ntasks-per-node=2" in script
    assert "--launcher srun --nproc-per-node 2" in script
    p = SlurmSite(slurm.prefix).test_only(LOCAL, job_name=f"sitemesh-{site}", script=script)
    assert p.answer.partition == "debug"


@pytest.mark.slow
def test_peer_gets_sigterm_before_the_wall_time(slurm: SlurmCluster, tmp_path: Path) -> None:
    fake_peer = tmp_path / "fake-peer"
    fake_peer.write_text(
        "#!/bin/bash\ntrap 'echo leaving; sleep 1; echo left; exit 0' TERM\necho serving \"$@\"\n"
        "while true; do sleep 0.2; done\n"
    )
    fake_peer.chmod(0o755)
    run = config.load(REPO / "examples/run.toml")
    base = run.sites["lumi"]
    params = dataclasses.replace(
        base.params,
        peer_command=str(fake_peer),
        modules=(),
        setup=(),
        signal_seconds=50,
        workdir=str(tmp_path),
    )
    site = dataclasses.replace(base, params=params)
    shape = dataclasses.replace(LOCAL, time_s=60)
    job = SlurmSite(slurm.prefix).submit(shape, "sitemesh-lumi", templates.render(site, run.path))
    # Slurm checks time limits (and so sends --signal) every 30 s: allow for that granularity.
    state = slurm.wait_for(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"}, timeout_s=150)
    out = (tmp_path / f"sitemesh-lumi-{job}.out").read_text()
    assert "sitemesh: SIGTERM before wall-time, peer leaving" in out
    assert out.index("leaving") < out.index("left")
    assert state == "COMPLETED", out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_job_starts_one_peer_whose_ranks_fill_the_allocation(
        slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered LUMI template as a real job on the 2-CPU test node: one task per "GPU" (2), one
    peer in the batch shell, whose trainer is a 2-rank srun step that trains rounds; SIGTERM before
    the wall-time is still a graceful leave (the ranks stop, the job completes)."""
    run_file = tmp_path / "run.toml"
    run_file.write_text('[sites.lumi]\nlisten = "127.0.0.1:0"\n')
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("SITEMESH_SRUN_ARGS", "")  # LUMI's CPU masks need its 64-core nodes
    run = config.load(REPO / "examples/run.toml")
    base = run.sites["lumi"]
    peer = (f"{sys.executable} -m peer.cli serve --preset lan --data-dir {tmp_path / 'data'} --train micro "
            f"--max-documents 6 --inner-steps 2 --batch-size 2 --round-deadline 60")
    params = dataclasses.replace(base.params, peer_command=peer, modules=(), setup=(), signal_seconds=60,
                                 workdir=str(tmp_path), remote_config=str(run_file))
    site = dataclasses.replace(base, params=params, shape=dataclasses.replace(base.shape, gpus_per_node=2))
    script = templates.render(site, run.path)
    assert "#SBATCH --ntasks-per-node=2" in script
    job = SlurmSite(slurm.prefix).submit(dataclasses.replace(LOCAL, time_s=180), "sitemesh-lumi", script)
    state = slurm.wait_for(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"}, timeout_s=300)
    out = (tmp_path / f"sitemesh-lumi-{job}.out").read_text()
    worker_log = (tmp_path / "data" / "state" / "trainer-worker.log").read_text()
    assert "starting the ranks: srun" in worker_log, worker_log[-3000:]
    assert re.search(r"rank 1/2 on \S+ pid \d+ joined", worker_log), worker_log[-3000:]
    assert re.search(r"round \d+ trained: \d+ samples", out), out[-3000:]
    assert "sitemesh: SIGTERM before wall-time, peer leaving" in out
    assert "peer lumi stopped" in out, out[-3000:]
    assert state == "COMPLETED", out[-3000:]
