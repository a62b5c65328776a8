"""The command layer without Slurm: options from probes (with jobs already submitted), flags, and
the exit status of configuration errors."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ops.placement import config
from ops.placement.commands import _parse_rate, options_for
from ops.placement.config import JobShape
from ops.placement.predictions import Calibration
from ops.placement.probing import SiteProbe
from ops.placement.slurm import JobStart, Prediction, TestOnlyAnswer

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _probe(jobs: dict[str, JobStart], job_shapes: dict[str, JobShape]) -> SiteProbe:
    site = config.load(REPO / "examples/run.toml").sites["lumi"]  # 8 nodes, options 2/4/8, 48 h
    predictions = tuple(
        Prediction("lumi", shape, NOW, TestOnlyAnswer(NOW + timedelta(hours=nodes), 1, "nid1", "standard-g"))
        for shape, nodes in zip(site.shapes(), (1, 2, 8))
    )
    return SiteProbe(site, predictions, Calibration("lumi", 0.5, 3, "test"), jobs, job_shapes)


def test_options_are_calibrated_probes_scaled_by_nodes() -> None:
    options, default = options_for(_probe({}, {}), NOW)
    assert [(o.shape.nodes, o.start_s, o.tokens_per_s) for o in options] == [
        (2, 0.5 * (3600 + 60) - 60, 192_000.0),
        (4, 0.5 * (7200 + 60) - 60, 384_000.0),
        (8, 0.5 * (8 * 3600 + 60) - 60, 768_000.0),
    ]
    assert default is options[2]


def test_a_refused_configured_shape_leaves_the_nearest_answered_one_as_default() -> None:
    full = _probe({}, {})
    eight = full.site.shape  # the configured shape, over this partition's node limit here
    probe = replace(full, predictions=full.predictions[:2], refused={eight: "node count exceeds limit"})
    options, default = options_for(probe, NOW)
    assert [o.shape.nodes for o in options] == [2, 4]
    assert default is options[1]


def test_a_running_job_is_the_only_option_until_its_wall_time() -> None:
    shape = JobShape(
        nodes=4, time_s=48 * 3600, gpus_per_node=8, partition="standard-g", account="project_465000000"
    )
    job = JobStart("77", "RUNNING", NOW - timedelta(hours=47), started=True)
    [option], default = options_for(_probe({"77": job}, {"77": shape}), NOW)
    assert default is option and option.existing_job == "77"
    assert (option.shape.nodes, option.start_s, option.end_s) == (4, 0.0, 3600.0)
    assert option.tokens_per_s == 384_000.0 and option.resubmit_wait_s == 0.5 * (7200 + 60) - 60


def test_a_pending_job_starts_when_slurm_expects() -> None:
    shape = JobShape(nodes=8, time_s=3600)
    job = JobStart("78", "PENDING", NOW + timedelta(hours=3), started=False)
    finished = JobStart("70", "COMPLETED", NOW - timedelta(days=3), started=True)
    [option], _ = options_for(_probe({"78": job, "70": finished}, {"78": shape, "70": shape}), NOW)
    assert (option.existing_job, option.start_s, option.end_s) == ("78", 3 * 3600.0, 4 * 3600.0)


@pytest.mark.parametrize("text", ["lumi", "lumi=", "=5", "lumi=-1", "lumi=fast"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected SITE=TOKENS_PER_S"):
        _parse_rate(text)
    assert _parse_rate("lumi=8e5") == ("lumi", 800_000.0)


def _ops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_configuration_errors_exit_2_with_the_message(tmp_path: Path) -> None:
    out = _ops("place", "--config", str(tmp_path / "missing.toml"))
    assert out.returncode == 2 and "missing.toml does not exist" in out.stderr
    # A prefix that cannot run: should the check ever come after the probes, nothing leaves the machine.
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        '[placement]\ntarget_tokens = 1.0\n[sites.a.slurm]\nnodes = 1\ntime = "1"\n'
        'command_prefix = ["/nonexistent/login"]\n'
    )
    out = _ops("place", "--config", str(run_file), "--tokens-per-s", "mars=1")
    assert out.returncode == 2 and "--tokens-per-s names site(s) without a slurm table: mars" in out.stderr
    out = _ops("place", "--config", str(run_file))
    assert out.returncode == 1 and "error: site a: cannot run /nonexistent/login" in out.stderr


def test_unreachable_peer_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        '[placement]\ntarget_tokens = 1.0\nprobe_timeout_s = 2\n[sites.a.slurm]\nnodes = 1\ntime = "1"\n'
    )
    out = _ops("place", "--config", str(run_file), "--peer", f"127.0.0.1:{port}")
    assert (
        out.returncode == 1
        and f"peer 127.0.0.1:{port} did not answer Admin/Status: UNAVAILABLE" in out.stderr
    )
