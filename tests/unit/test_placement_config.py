"""The placement tables of the run file: parsing, validation, the error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.placement import config
from ops.placement.config import JobShape, PlacementConfigError, format_slurm_time, parse_slurm_time

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90 * 60),
        ("90", 90 * 60),
        ("5:30", 5 * 60 + 30),
        ("12:00:00", 12 * 3600),
        ("2-00:00:00", 48 * 3600),
        ("1-6", 30 * 3600),
        ("1-6:15", 30 * 3600 + 15 * 60),
    ],
)
def test_slurm_time_limits(text: str | int, seconds: int) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2:3:4", "two hours", "1-", "-1"])
def test_bad_slurm_time(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        parse_slurm_time(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(60, "00:01:00"), (61, "00:02:00"), (7200, "02:00:00"), (2 * 86400 + 90, "2-00:02:00")],
)
def test_time_is_sent_rounded_up_to_minutes(seconds: int, text: str) -> None:
    assert format_slurm_time(seconds) == text


def test_shape_as_sbatch_options() -> None:
    shape = JobShape(
        nodes=8, time_s=7200, gpus_per_node=8, partition="batch", account="abc", extra_args=("-C", "nvme")
    )
    assert shape.sbatch_args() == [
        "--nodes=8",
        "--time=02:00:00",
        "--gpus-per-node=8",
        "--partition=batch",
        "--account=abc",
        "-C",
        "nvme",
    ]
    assert JobShape(nodes=1, time_s=60).sbatch_args() == ["--nodes=1", "--time=00:01:00"]


@pytest.mark.parametrize("kwargs", [{"nodes": 0}, {"time_s": 30}, {"gpus_per_node": -1}])
def test_shape_validation(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        JobShape(**{"nodes": 1, "time_s": 60, **kwargs})


def test_example_run_file() -> None:
    run = config.load(REPO / "examples/run.toml")
    assert sorted(run.sites) == ["frontier", "lumi", "snellius"]
    lumi = run.sites["lumi"]
    assert (lumi.shape.nodes, lumi.shape.gpus_per_node, lumi.shape.time_s) == (8, 8, 48 * 3600)
    assert [s.nodes for s in lumi.shapes()] == [2, 4, 8]
    assert lumi.tokens_per_s_for(lumi.shapes()[0]) == pytest.approx(lumi.tokens_per_s / 4)
    assert lumi.params.template == REPO / "examples/../scripts/slurm/lumi-mi250x.sbatch"
    assert run.sites["frontier"].shape.time_s == 7200
    assert run.placement.log == REPO / "examples/../runs/placement.jsonl"
    assert run.placement.target_tokens == 1.5e11


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


MINIMAL = """
[run]
name = "x"
[membership]
preset = "wan"
[placement]
target_tokens = 1e9
[sites.a]
listen = "0.0.0.0:7001"
tokens_per_s = 10.0
[sites.a.slurm]
nodes = 2
time = "1:00:00"
[sites.b]
listen = "0.0.0.0:7002"
"""


def test_foreign_tables_are_ignored_and_sites_without_slurm_are_not_placeable(tmp_path: Path) -> None:
    run = config.load(_write(tmp_path, MINIMAL))
    assert list(run.sites) == ["a"]
    assert run.sites["a"].node_options == (2,) and run.sites["a"].tokens_per_s == 10.0
    with pytest.raises(PlacementConfigError, match=r"no \[sites.b.slurm\] table \(sites with one: a\)"):
        run.select("b")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("[sites.a.slurm]\n", "[sites.a.slurm]\nnode = 3\n"), r"unknown key\(s\) node in \[sites.a.slurm\]"),
        (("[placement]\n", "[placement]\ntarget = 1\n"), r"unknown key\(s\) target in \[placement\]"),
        (("target_tokens = 1e9\n", ""), r"\[placement\] needs target_tokens"),
        (('time = "1:00:00"\n', ""), r"\[sites.a.slurm\] needs time"),
        (('time = "1:00:00"\n', 'time = "soon"\n'), r"\[sites.a.slurm\]: time 'soon' is not a Slurm time"),
        (("nodes = 2\n", "nodes = 2\nnode_options = [0]\n"), r"node_options must be positive"),
        (("nodes = 2\n", 'nodes = 2\nmodules = "rocm"\n'), r"modules must be a list of strings"),
        (("nodes = 2\n", 'nodes = 2\nenv = { "1X" = "y" }\n'), r"env name '1X' is not a shell variable"),
        (("target_tokens = 1e9\n", "target_tokens = 0\n"), r"target_tokens must be > 0"),
        (("nodes = 2\n", "nodes = 2\nleave_seconds = -1\n"), r"leave_seconds must be >= 0, got -1"),
    ],
)
def test_errors_name_the_key_and_the_file(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = _write(tmp_path, MINIMAL.replace(*edit, 1))
    with pytest.raises(PlacementConfigError, match=message) as err:
        config.load(path)
    assert str(path) in str(err.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(PlacementConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    with pytest.raises(PlacementConfigError, match="not valid TOML"):
        config.load(_write(tmp_path, "[placement\n"))
