"""The placement parts of the run file: `[sites.NAME.slurm]` (job shape, how to reach sbatch, the
sbatch template) and the top-level `[placement]` table (target, prediction log, calibration).

    python -c "from ops.placement.config import load; print(load('examples/run.toml'))"

Only these tables are validated here; other tables belong to the peer (peer/config.py) and are
ignored. Of a site's plain keys only `tokens_per_s` is read: the throughput measured for the job
shape in `[sites.NAME.slurm]`. Unknown keys in the tables owned here are an error naming the key
and the file. Paths (template, log) are relative to the run file's directory.

    [placement]
    target_tokens = 2.0e10            # train until this many tokens (time-to-target is minimised)
    log = "runs/placement.jsonl"      # prediction log: probes, submissions, real starts
    calibration_min_samples = 3       # (prediction, real start) pairs before calibrating a site
    probe_timeout_s = 60              # one sbatch call, login nodes can be slow

    [sites.lumi.slurm]
    nodes = 16                        # the shape tokens_per_s was measured for
    node_options = [4, 8, 16]         # shapes the planner may choose from (default: [nodes])
    gpus_per_node = 8                 # 0 = do not ask for GPUs (CPU-only test clusters)
    time = "2-00:00:00"               # wall-time limit, Slurm syntax
    partition = "standard-g"
    account = "project_465000000"
    qos = ""                          # empty = the account's default
    extra_args = ["--exclusive"]      # further sbatch options, passed as given
    command_prefix = ["ssh", "lumi-uan01"]  # runs its last argument as a shell line; [] = local
    template = "../scripts/slurm/lumi-mi250x.sbatch"
    signal_seconds = 300              # SIGTERM this long before the wall-time ends
    leave_seconds = 300               # the peer leaves on its own this long before it (default: signal_seconds)
    peer_command = "peer serve"
    remote_config = "/project/x/run.toml"   # the run file's path on that site (default: this path)
    workdir = "/scratch/project_x/sitemesh"  # the job's working directory and log place (default: sbatch's)
    modules = ["LUMI/24.03", "partition/G", "rocm/6.0.3"]
    setup = ["source /project/x/venv/bin/activate"]
    env = { MIOPEN_USER_DB_PATH = "/tmp/miopen" }
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 sites only
    import tomli as tomllib


class PlacementConfigError(ValueError):
    """A problem in the placement tables that the user can fix; the message names key and file."""


_SLURM_TIME_RE = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)


def parse_slurm_time(text: str | int) -> int:
    """Seconds in a Slurm time limit: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S" (or int minutes)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text * 60
    m = _SLURM_TIME_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"time {text!r} is not a Slurm time limit such as 90, 12:00:00 or 2-00:00:00")
    if m.group("days") is not None:
        d, h, mi, s = (int(m.group(k) or 0) for k in ("days", "dh", "dm", "ds"))
        return ((d * 24 + h) * 60 + mi) * 60 + s
    a, b, c = m.group("a"), m.group("b"), m.group("c")
    if c is not None:  # H:M:S
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # M:S
        return int(a) * 60 + int(b)
    return int(a) * 60


def format_slurm_time(seconds: int) -> str:
    """The `--time` value for `seconds`, rounded up to whole minutes (Slurm's own granularity)."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


@dataclass(frozen=True)
class JobShape:
    """What one site's job asks Slurm for."""

    nodes: int
    """Whole nodes; throughput is assumed linear in nodes (data parallel inside a site)."""
    time_s: int
    """Wall-time limit in seconds (sent rounded up to minutes)."""
    gpus_per_node: int = 0
    """GPUs per node; 0 sends no GPU request (test clusters without GRES)."""
    partition: str = ""
    """Empty = the cluster's default partition."""
    account: str = ""
    """Empty = the user's default account."""
    qos: str = ""
    """Empty = the account's default QOS."""
    extra_args: tuple[str, ...] = ()
    """Further sbatch options, passed through unchanged (e.g. --exclusive, --constraint=...)."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.time_s < 60:
            raise ValueError(f"time must be at least one minute, got {self.time_s} s")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")

    def sbatch_args(self) -> list[str]:
        """The shape as sbatch options; they override any #SBATCH line of a template."""
        args = [f"--nodes={self.nodes}", f"--time={format_slurm_time(self.time_s)}"]
        if self.gpus_per_node:
            args.append(f"--gpus-per-node={self.gpus_per_node}")
        for flag, value in (("partition", self.partition), ("account", self.account), ("qos", self.qos)):
            if value:
                args.append(f"--{flag}={value}")
        return args + list(self.extra_args)

    def describe(self) -> str:
        gpus = f"x{self.gpus_per_node}gpu" if self.gpus_per_node else ""
        where = self.partition or "default"
        return f"{self.nodes}n{gpus} {format_slurm_time(self.time_s)} @{where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "time_s": self.time_s,
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "extra_args": list(self.extra_args),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> JobShape:
        """The inverse of `to_json` (shapes stored in the prediction log)."""
        return JobShape(
            nodes=int(d["nodes"]),
            time_s=int(d["time_s"]),
            gpus_per_node=int(d.get("gpus_per_node", 0)),
            partition=str(d.get("partition", "")),
            account=str(d.get("account", "")),
            qos=str(d.get("qos", "")),
            extra_args=tuple(d.get("extra_args", ())),
        )


@dataclass(frozen=True)
class TemplateParams:
    """What a site's sbatch template is filled with (see ops/placement/templates.py)."""

    template: Path | None
    """The template file; None = this site cannot be submitted to (probe and plan only)."""
    signal_seconds: int = 300
    """SIGTERM the peer this long before the wall-time ends, so it leaves the mesh gracefully."""
    leave_seconds: int | None = None
    """The peer leaves on its own this long before the job's end (`peer serve --leave-before`),
    whether or not the signal came: slurmctld sends it up to 30 s early at its periodic check, and
    a launcher may not pass it on. None: signal_seconds."""
    peer_command: str = "peer serve"
    remote_config: str = ""
    """The run file's path as the site sees it (empty = the local path)."""
    workdir: str = ""
    """The job's working directory (`--chdir`), where its output file goes (empty = sbatch's cwd)."""
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    """Shell lines run before the peer starts (activate a venv, set ulimits)."""
    env: tuple[tuple[str, str], ...] = ()

    @property
    def leave_before(self) -> int:
        """Seconds before the job's end its peer leaves at the latest."""
        return self.signal_seconds if self.leave_seconds is None else self.leave_seconds

    def __post_init__(self) -> None:
        if self.signal_seconds < 0:
            raise ValueError(f"signal_seconds must be >= 0, got {self.signal_seconds}")
        if self.leave_seconds is not None and self.leave_seconds < 0:
            raise ValueError(f"leave_seconds must be >= 0, got {self.leave_seconds}")
        for name, _ in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"env name {name!r} is not a shell variable name")


@dataclass(frozen=True)
class SiteSlurm:
    """One site as placement sees it."""

    name: str
    shape: JobShape
    """The shape `tokens_per_s` was measured for, and the default request."""
    node_options: tuple[int, ...]
    """Node counts the planner may ask for instead (always includes shape.nodes)."""
    tokens_per_s: float
    """Throughput of `shape` from the run file (0 = unknown; `ops place --tokens-per-s` overrides)."""
    command_prefix: tuple[str, ...] = ()
    """Empty: run sbatch here. Otherwise a command that runs its last argument as a shell line."""
    params: TemplateParams = field(default_factory=lambda: TemplateParams(template=None))

    def __post_init__(self) -> None:
        if self.tokens_per_s < 0:
            raise ValueError(f"tokens_per_s must be >= 0, got {self.tokens_per_s}")
        if not self.node_options or any(n < 1 for n in self.node_options):
            raise ValueError(f"node_options must be positive node counts, got {list(self.node_options)}")

    def shapes(self) -> list[JobShape]:
        """Every shape the planner may choose for this site, smallest first."""
        return [_with_nodes(self.shape, n) for n in sorted(set(self.node_options))]

    def tokens_per_s_for(self, shape: JobShape) -> float:
        return self.tokens_per_s * shape.nodes / self.shape.nodes


def _with_nodes(shape: JobShape, nodes: int) -> JobShape:
    return replace(shape, nodes=nodes)


@dataclass(frozen=True)
class Placement:
    """The `[placement]` table."""

    target_tokens: float
    """Tokens to train; the planner minimises the time until they are reached."""
    log: Path
    """JSON-lines prediction log (probes, submissions, real starts) used for calibration."""
    calibration_min_samples: int = 3
    """Pairs of (prediction, real start) a site needs before its predictions are corrected."""
    probe_timeout_s: float = 60.0
    """Limit for one sbatch call; a login node under load can take tens of seconds."""

    def __post_init__(self) -> None:
        if not self.target_tokens > 0:
            raise ValueError(f"target_tokens must be > 0, got {self.target_tokens}")
        if self.calibration_min_samples < 1:
            raise ValueError(f"calibration_min_samples must be >= 1, got {self.calibration_min_samples}")
        if not self.probe_timeout_s > 0:
            raise ValueError(f"probe_timeout_s must be > 0, got {self.probe_timeout_s}")


@dataclass(frozen=True)
class PlacementRun:
    """Everything placement reads from one run file."""

    path: Path
    placement: Placement
    sites: Mapping[str, SiteSlurm]
    """Sites that have a `[sites.NAME.slurm]` table, by name."""

    def select(self, site: str | None) -> list[SiteSlurm]:
        """All placeable sites, or the named one (error naming the known sites if absent)."""
        if site is None:
            return [self.sites[name] for name in sorted(self.sites)]
        if site not in self.sites:
            known = ", ".join(sorted(self.sites)) or "none"
            raise PlacementConfigError(
                f"{self.path}: no [sites.{site}.slurm] table (sites with one: {known})"
            )
        return [self.sites[site]]


_PLACEMENT_KEYS = {"target_tokens", "log", "calibration_min_samples", "probe_timeout_s"}
_SLURM_KEYS = {
    "nodes",
    "node_options",
    "gpus_per_node",
    "time",
    "partition",
    "account",
    "qos",
    "extra_args",
    "command_prefix",
    "template",
    "signal_seconds",
    "leave_seconds",
    "peer_command",
    "remote_config",
    "workdir",
    "modules",
    "setup",
    "env",
}


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str, path: Path) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PlacementConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(sorted(allowed))}"
        )


def _strings(value: Any, key: str, where: str, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlacementConfigError(f"{path}: {where} {key} must be a list of strings, got {value!r}")
    return tuple(value)


def _site(name: str, section: Mapping[str, Any], path: Path) -> SiteSlurm:
    where = f"[sites.{name}.slurm]"
    table = section["slurm"]
    if not isinstance(table, dict):
        raise PlacementConfigError(f"{path}: {where} must be a table")
    _check_keys(table, _SLURM_KEYS, where, path)
    for required in ("nodes", "time"):
        if required not in table:
            raise PlacementConfigError(f"{path}: {where} needs {required}")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise PlacementConfigError(f"{path}: {where} env must be a table of strings, got {env!r}")
    template = table.get("template")
    try:
        shape = JobShape(
            nodes=int(table["nodes"]),
            time_s=parse_slurm_time(table["time"]),
            gpus_per_node=int(table.get("gpus_per_node", 0)),
            partition=str(table.get("partition", "")),
            account=str(table.get("account", "")),
            qos=str(table.get("qos", "")),
            extra_args=_strings(table.get("extra_args", []), "extra_args", where, path),
        )
        options = table.get("node_options", [shape.nodes])
        if not isinstance(options, list) or not all(isinstance(n, int) for n in options):
            raise ValueError(f"node_options must be a list of integers, got {options!r}")
        params = TemplateParams(
            template=(path.parent / template) if template else None,
            signal_seconds=int(table.get("signal_seconds", 300)),
            leave_seconds=int(table["leave_seconds"]) if "leave_seconds" in table else None,
            peer_command=str(table.get("peer_command", "peer serve")),
            remote_config=str(table.get("remote_config", "")),
            workdir=str(table.get("workdir", "")),
            modules=_strings(table.get("modules", []), "modules", where, path),
            setup=_strings(table.get("setup", []), "setup", where, path),
            env=tuple(sorted(env.items())),
        )
        return SiteSlurm(
            name=name,
            shape=shape,
            node_options=tuple(sorted(set(options) | {shape.nodes})),
            tokens_per_s=float(section.get("tokens_per_s", 0.0)),
            command_prefix=_strings(table.get("command_prefix", []), "command_prefix", where, path),
            params=params,
        )
    except PlacementConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise PlacementConfigError(f"{path}: {where}: {err}") from err


def load(path: str | Path) -> PlacementRun:
    """Reads the placement tables of the run file at `path`."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as err:
        raise PlacementConfigError(f"config file {path} does not exist") from err
    except tomllib.TOMLDecodeError as err:
        raise PlacementConfigError(f"{path}: not valid TOML: {err}") from err
    table = doc.get("placement")
    if not isinstance(table, dict):
        raise PlacementConfigError(f"{path}: needs a [placement] table with target_tokens")
    _check_keys(table, _PLACEMENT_KEYS, "[placement]", path)
    if "target_tokens" not in table:
        raise PlacementConfigError(f"{path}: [placement] needs target_tokens")
    try:
        placement = Placement(
            target_tokens=float(table["target_tokens"]),
            log=path.parent / str(table.get("log", "runs/placement.jsonl")),
            calibration_min_samples=int(table.get("calibration_min_samples", 3)),
            probe_timeout_s=float(table.get("probe_timeout_s", 60.0)),
        )
    except (TypeError, ValueError) as err:
        raise PlacementConfigError(f"{path}: [placement]: {err}") from err
    sites = {
        name: _site(name, section, path)
        for name, section in doc.get("sites", {}).items()
        if isinstance(section, dict) and "slurm" in section
    }
    return PlacementRun(path=path, placement=placement, sites=sites)
