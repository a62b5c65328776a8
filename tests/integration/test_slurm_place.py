"""`ops place`, `ops submit` and `ops probe` end to end against a real local Slurm cluster: two
sites are the cluster's `busy` and `free` partitions (tests/integration/slurm_cluster.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.peers import Cluster
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "scripts/slurm/snellius-h100.sbatch"


def _run_file(tmp_path: Path, cluster: SlurmCluster) -> Path:
    """Two 1000 tokens/s sites and a 30 000-token target: the free site alone needs 30 s."""
    sites = "".join(
        f"""
[sites.{name}]
tokens_per_s = 1000.0

[sites.{name}.slurm]
nodes = 1
time = "1"
partition = "{name}"
command_prefix = {json.dumps(cluster.prefix)}
template = "{TEMPLATE}"
peer_command = "echo peer"
workdir = "{tmp_path}"
"""
        for name in ("busy", "free")
    )
    path = tmp_path / "run.toml"
    path.write_text(f'[placement]\ntarget_tokens = 30000.0\nlog = "placement.jsonl"\n{sites}')
    return path


def _ops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def _load_busy(cluster: SlurmCluster) -> str:
    """Occupies the busy partition's one CPU for its whole minute-long time limit."""
    job = cluster.sbatch("--partition=busy", "--time=1", "--wrap=sleep 300")
    cluster.wait_for(job, {"RUNNING"}, timeout_s=15)
    return job


def _sites(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["site"]: s for s in plan["sites"]}


def test_place_picks_the_free_partition(slurm: SlurmCluster, tmp_path: Path) -> None:
    config = _run_file(tmp_path, slurm)
    _load_busy(slurm)
    out = _ops("place", "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["plan"]
    sites = _sites(plan)
    assert sites["free"]["submit"] is True and sites["free"]["predicted_start_s"] < 10
    assert sites["busy"]["submit"] is False
    assert "after the target is reached" in sites["busy"]["reason"]
    assert 30 <= plan["time_to_target_s"] <= 40
    # The people's table says the same.
    table = _ops("place", "--config", str(config)).stdout
    rows = {
        line.split()[0]: line.split()[1] for line in table.splitlines() if line.startswith(("busy", "free"))
    }
    assert rows == {"busy": "skip", "free": "submit"}


def test_submit_runs_the_template_and_probe_learns_the_real_start(
    slurm: SlurmCluster,
    tmp_path: Path,
) -> None:
    config = _run_file(tmp_path, slurm)
    blocker = _load_busy(slurm)
    dry = _ops("submit", "--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --signal=B:TERM@300" in dry.stdout
    assert slurm.run("squeue", "--noheader", "--format=%i").stdout.split() == [blocker]

    out = _ops("submit", "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    [submitted] = json.loads(out.stdout)["submitted"]
    assert submitted["site"] == "free"
    job = submitted["job_id"]
    assert slurm.wait_for(job, {"COMPLETED", "FAILED"}, timeout_s=30) == "COMPLETED"
    # The rendered template ran: the peer command got the run file and the site.
    log_text = (tmp_path / f"sitemesh-free-{job}.out").read_text()
    assert f"peer --config {config} --site free" in log_text
    assert f"sitemesh: site free job {job}" in log_text

    probe = _ops("probe", "--config", str(config), "--site", "free", "--json")
    assert probe.returncode == 0, probe.stderr
    [free] = json.loads(probe.stdout)["sites"]
    assert [(j["job_id"], j["started"]) for j in free["jobs"]] == [(job, True)]
    records = [json.loads(line) for line in (tmp_path / "placement.jsonl").read_text().splitlines()]
    assert [r["job_id"] for r in records if r["kind"] == "start"] == [job]
    assert {r["site"] for r in records if r["kind"] == "probe"} == {"busy", "free"}


def test_place_uses_the_throughput_running_peers_gossip(slurm: SlurmCluster, tmp_path: Path) -> None:
    config = _run_file(tmp_path, slurm)
    # A running peer of site `free` that reports 4000 tokens/s (standing in for its measurement).
    peer_file = tmp_path / "peer.toml"
    peer_file.write_text("[sites.free]\ntokens_per_s = 4000.0\n")
    peers = Cluster(tmp_path)
    try:
        peer = peers.start("free", extra=["--config", str(peer_file)])
        out = _ops("place", "--config", str(config), "--peer", peer.address, "--json")
    finally:
        peers.close()
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["plan"]
    sites = _sites(plan)
    assert (sites["free"]["tokens_per_s"], sites["busy"]["tokens_per_s"]) == (4000.0, 1000.0)
    # Both partitions are idle: 5000 tokens/s together reach 30 000 tokens in about 6 s.
    assert sites["free"]["submit"] and sites["busy"]["submit"]
    assert 5 <= plan["time_to_target_s"] <= 10
    flag = _ops("place", "--config", str(config), "--tokens-per-s", "free=2000", "--json")
    assert _sites(json.loads(flag.stdout)["plan"])["free"]["tokens_per_s"] == 2000.0


def test_a_refused_node_count_leaves_the_others_to_probe_and_plan(slurm: SlurmCluster, tmp_path: Path) -> None:
    """This Slurm has one node: a site configured for two, with one as its other option, has its
    configured shape refused; the one-node probe still counts, and the plan is made of it."""
    config = tmp_path / "run.toml"
    config.write_text(f"""
[placement]
target_tokens = 30000.0
log = "placement.jsonl"
[sites.wide]
tokens_per_s = 2000.0
[sites.wide.slurm]
nodes = 2
node_options = [1]
time = "1"
partition = "free"
command_prefix = {json.dumps(slurm.prefix)}
""")
    out = _ops("probe", "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    [wide] = json.loads(out.stdout)["sites"]
    assert wide["error"] is None and [p["shape"]["nodes"] for p in wide["probes"]] == [1]
    [refused] = wide["refused"]
    assert refused["shape"]["nodes"] == 2
    assert refused["reason"].endswith("Requested node configuration is not available"), refused
    table = _ops("probe", "--config", str(config))
    assert table.returncode == 0 and f"wide: 2n 00:01:00 @free refused: {refused['reason']}" in table.stdout

    out = _ops("place", "--config", str(config), "--json")
    assert out.returncode == 0, out.stderr
    [site] = json.loads(out.stdout)["plan"]["sites"]
    assert site["submit"] is True and site["shape"]["nodes"] == 1
    records = [json.loads(line) for line in (tmp_path / "placement.jsonl").read_text().splitlines()]
    assert {r["shape"]["nodes"] for r in records if r["kind"] == "probe"} == {1}
