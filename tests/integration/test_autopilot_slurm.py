"""`ops autopilot` against a real local Slurm (tests/integration/slurm_cluster.py): a site gets its
first job, then a successor queued to start before the running job's end; a restarted loop, one
whose state file is gone, and a job cancelled under it never make it reuse a job name; a job whose
batch script fails before its peer starts is kept in its state and counted by `ops report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ops import report
from peer import timeline_file
from peer.core.timeline import RoundTimeline
from tests.integration.autopilot_mesh import RUN, listed_jobs
from tests.integration.peers import wait_for
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "scripts/slurm/snellius-h100.sbatch"


def _run_file(tmp_path: Path, cluster: SlurmCluster, slurm_extra: str = "", site: str = "free") -> Path:
    peer = tmp_path / "fake-peer"  # stands for `peer serve`: trains "forever", leaves at SIGTERM
    peer.write_text("#!/bin/bash\ntrap 'exit 0' TERM\nwhile true; do sleep 0.2; done\n")
    peer.chmod(0o755)
    return _write_run(tmp_path, _site(site, cluster, peer, tmp_path, "free", slurm_extra))


def _site(name: str, cluster: SlurmCluster, peer: Path, workdir: Path, partition: str, slurm_extra: str = "") -> str:
    """A site's tables in the run file: 1-node, 3-minute jobs of `partition` running `peer`."""
    return f"""
[sites.{name}]
tokens_per_s = 1000.0
[sites.{name}.slurm]
nodes = 1
time = "3"
partition = "{partition}"
command_prefix = {json.dumps(cluster.prefix)}
template = "{TEMPLATE}"
peer_command = "{peer}"
workdir = "{workdir}"
{slurm_extra}
"""


def _write_run(tmp_path: Path, sites: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nname = "{RUN}"\n[placement]\ntarget_tokens = 1e9\nlog = "placement.jsonl"\n{sites}')
    return path


def _pass(config: Path, *extra: str, site: str = "free") -> list[str]:
    done = subprocess.run([sys.executable, "-m", "ops.cli", "autopilot", "--config", str(config), "--once",
                           "--handover", "60", *extra], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split(" ", 2)[2] for line in done.stderr.splitlines() if f"{site}: " in line]


def _jobs(cluster: SlurmCluster) -> dict[int, tuple[str, str]]:
    """seq -> (job id, state) of the run's jobs Slurm lists."""
    return listed_jobs(cluster, "free")


def test_the_loop_keeps_a_successor_queued_and_never_reuses_a_job_name(slurm: SlurmCluster, tmp_path: Path) -> None:
    config = _run_file(tmp_path, slurm)
    (line,) = _pass(config)
    assert line.startswith("free: submitted sitemesh-soak-free-1 as job ") and "it has no job yet" in line
    wait_for(lambda: _jobs(slurm).get(1, ("", ""))[1] == "RUNNING", 30, "job 1 to run")

    (line,) = _pass(config)  # job 1 runs: its successor queues, to start 60 s before job 1's end
    assert line.startswith("free: submitted sitemesh-soak-free-2") and "its successor may start from" in line
    assert _jobs(slurm)[2][1] == "PENDING"
    held = _pass(config)
    assert held == ["free: holding: job 2 (%s) is queued" % _jobs(slurm)[2][0]]

    # A loop that lost its state file (a second loop on another machine) reads the queue and holds.
    state = config.with_name(config.name + ".autopilot.json")
    assert json.loads(state.read_text())["seen"] == {"free": 2}
    state.unlink()
    assert _pass(config) == held

    # The queued successor is cancelled under it: replaced under a new name, never 2 again.
    slurm.run("scancel", _jobs(slurm)[2][0])
    wait_for(lambda: _jobs(slurm)[2][1] == "CANCELLED", 30, "job 2 to be cancelled")
    (line,) = _pass(config)
    assert line.startswith("free: submitted sitemesh-soak-free-3")
    assert sorted(_jobs(slurm)) == [1, 2, 3]
    decisions = json.loads(state.read_text())["decisions"]
    assert [d["kind"] for d in decisions] == ["hold", "submit"]

    # Job 1 dies long before its wall time: its successor, held back by --begin, may start now.
    assert _jobs(slurm)[3][1] == "PENDING"
    slurm.run("scancel", _jobs(slurm)[1][0])
    wait_for(lambda: _jobs(slurm)[1][1] == "CANCELLED", 30, "job 1 to be cancelled")
    (line,) = _pass(config)
    assert line.startswith(f"free: starting job 3 ({_jobs(slurm)[3][0]}) now: no job running"), line
    wait_for(lambda: _jobs(slurm)[3][1] == "RUNNING", 30, "job 3 to start without waiting for its --begin")


def test_the_loop_asks_slurm_which_node_count_to_submit(slurm: SlurmCluster, tmp_path: Path) -> None:
    """With `node_options` the loop probes each shape (`sbatch --test-only`) and submits the one whose
    job trains the most tokens; this Slurm has one node, so it refuses two and one is submitted, with
    the probes' word in the decision line and the prediction in the log that calibrates them."""
    # A site of its own: Slurm lists the other tests' ended jobs of `free` for 10 minutes (MinJobAge).
    config = _run_file(tmp_path, slurm, "node_options = [1, 2]", site="wide")
    (line,) = _pass(config, site="wide")
    assert line.startswith("wide: submitted sitemesh-soak-wide-1 as job "), line
    assert "(1n 00:03:00 @free)" in line and "1 node: predicted start" in line, line
    assert "2 nodes refused (" in line, line
    records = [json.loads(x) for x in (tmp_path / "placement.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["probe", "submit"], records
    assert records[1]["shape"]["nodes"] == 1 and records[1]["job_id"] == listed_jobs(slurm, "wide")[1][0]


def test_a_job_whose_batch_script_fails_before_its_peer_counts_in_the_report(slurm: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    """Site `broken`'s batch script fails in its set-up (a venv that is not there) before its peer
    starts, so its job leaves no record; site `ok`'s peer keeps its record (peer/job_record.py) and
    leaves. `ops report --autopilot-state` counts broken's job from the loop's state file, its whole
    allocation as no peer, and ok's job once, from its record."""
    peer = tmp_path / "recording-peer"  # stands for `peer serve`: keeps its job's record, leaves
    peer.write_text(f"""#!{sys.executable}
import sys, time
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from peer.job_record import JobLog
args = sys.argv[1:]
site, job = args[args.index("--site") + 1], args[args.index("--job") + 1]
log = JobLog(Path({str(tmp_path)!r}) / site / f"j{{job}}", f"{{site}}.j{{job}}")
log.started()
time.sleep(2)
log.exited()
""")
    peer.chmod(0o755)
    sites = "".join(_site(site, slurm, peer, tmp_path, "shared", f"setup = {setup}")
                    for site, setup in (("broken", f'["sleep 3", "source {tmp_path}/no-venv/bin/activate"]'),
                                        ("ok", "[]")))
    config = _write_run(tmp_path, sites)
    _pass(config)
    broken, ok = listed_jobs(slurm, "broken")[1][0], listed_jobs(slurm, "ok")[1][0]
    wait_for(lambda: listed_jobs(slurm, "broken")[1][1] == "FAILED", 60, "broken's job 1 to fail in its set-up")
    wait_for(lambda: listed_jobs(slurm, "ok")[1][1] == "COMPLETED", 60, "ok's job 1 to complete")
    _pass(config, site="broken")  # the pass that sees them ended (and submits each site's job 2)
    state = config.with_name(config.name + ".autopilot.json")
    jobs = {(j["site"], j["seq"]): j for j in json.loads(state.read_text())["jobs"]}
    seen = jobs[("broken", 1)]
    assert (seen["job_id"], seen["state"], seen["slurm_state"], seen["nodes"]) == (broken, "failed", "FAILED", 1)
    assert seen["end"] - seen["start"] >= 3, seen  # the set-up's `sleep 3`, by Slurm's clock
    assert jobs[("ok", 1)]["state"] == "ended" and jobs[("broken", 2)]["state"] == "queued"

    (tmp_path / "broken").mkdir()  # a site whose jobs never started a peer: an empty data dir
    timeline_file.append(tmp_path / "ok", RoundTimeline(1, "ok", compute_s=1.0))  # ops report wants a round
    dirs = [tmp_path / "broken", tmp_path / "ok"]
    acc = report.collect(dirs, autopilot_state=state).allocations()
    assert acc is not None
    (no_peer,) = acc.total.no_peer
    assert (no_peer.record.job, no_peer.record.member, no_peer.no_peer) == (broken, "broken.j1", "FAILED")
    assert no_peer.no_peer_s == seen["end"] - seen["start"]
    assert [(j.record.job, j.no_peer) for j in acc.total.jobs if j.site == "ok"][0] == (ok, "")  # once, its record
    assert sum(1 for j in acc.total.jobs if j.record.job == ok) == 1
    done = subprocess.run([sys.executable, "-m", "ops.cli", "report", *[a for d in dirs for a in ("--data-dir", str(d))],
                           "--autopilot-state", str(state), "--format", "md"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"No peer record for job(s) {broken} (broken.j1, FAILED, " in done.stdout, done.stdout
