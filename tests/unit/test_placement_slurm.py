"""The Slurm adaptor without a cluster: parsing sbatch's answer, the command prefix, and the errors
when sbatch is missing or says something unexpected (real processes, no fake sbatch)."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ops.placement.slurm import SlurmError, SlurmSite, parse_test_only

ANSWER = "sbatch: Job 1 to start at 2026-11-30T05:06:05 using 1 processors on nodes vm in partition debug"


def test_parses_the_answer_of_slurm_22() -> None:
    a = parse_test_only(ANSWER + "\n")
    assert a.start == datetime(2026, 11, 30, 5, 6, 5, tzinfo=timezone.utc)
    assert (a.processors, a.nodelist, a.partition) == (1, "vm", "debug")


def test_parses_a_hostlist_among_warnings() -> None:
    text = (
        "sbatch: Warning: the GPU count is rounded\n"
        "sbatch: Job 4411 to start at 2027-01-02T23:59:00 using 1024 processors on nodes "
        "nid[005001-005016] in partition standard-g\n"
    )
    a = parse_test_only(text)
    assert (a.processors, a.nodelist, a.partition) == (1024, "nid[005001-005016]", "standard-g")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sbatch: error: Batch job submission failed: Invalid account",
        "sbatch: Job 1 to start at tomorrow using 1 processors on nodes vm in partition debug",
    ],
)
def test_unparseable_answer_shows_the_raw_text(text: str) -> None:
    with pytest.raises(SlurmError) as err:
        parse_test_only(text)
    assert text.strip() in str(err.value)


def test_prefix_runs_the_command_line_as_one_shell_argument() -> None:
    # Through `bash -c` as through `ssh host`: arguments with spaces and quotes arrive intact.
    site = SlurmSite(["bash", "-c"])
    assert site.command(["sbatch", "--wrap=a b"])[:2] == ["bash", "-c"]
    out = site.run(["printf", "%s|", "a b", "c'd", "$HOME"]).stdout
    assert out == "a b|c'd|$HOME|"


def test_commands_run_in_utc_with_standard_time_format() -> None:
    out = SlurmSite(["bash", "-c"]).run(["sh", "-c", "echo $TZ $SLURM_TIME_FORMAT"]).stdout
    assert out.split() == ["UTC", "standard"]


def test_missing_sbatch_is_a_clear_error(tmp_path: Path) -> None:
    # A PATH where `env` exists but sbatch does not, reached through the prefix like a login node.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("env") or "/usr/bin/env", bin_dir / "env")
    site = SlurmSite(["/usr/bin/env", f"PATH={bin_dir}", "/bin/bash", "-c"])
    with pytest.raises(SlurmError, match=r"sbatch is not installed there \(exit 127\)\n.*sbatch") as err:
        site.run(["sbatch", "--test-only"])
    assert "No such file or directory" in str(err.value)


def test_missing_prefix_command_is_a_clear_error() -> None:
    with pytest.raises(SlurmError, match="cannot run .*no-such-login-tool"):
        SlurmSite(["/nonexistent/no-such-login-tool", "host"]).run(["sbatch"])


def test_timeout_is_a_clear_error() -> None:
    with pytest.raises(SlurmError, match="did not answer within 0.2 s"):
        SlurmSite(["bash", "-c"], timeout_s=0.2).run(["sleep", "5"])
