"""Peer configuration: one TOML run file for a whole multi-site run, a section per site.

    peer serve --config examples/run.toml --site lumi

Layout (every key optional unless said; unknown keys are an error that names the key and file):

    [run]
    name = "c4-qwen3"                 # run name, shown in status and logs
    insecure = false                  # true: plaintext gRPC, no certificates (loopback experiments)

    [membership]
    preset = "wan"                    # lan | wan | local_test (peer.core.membership.MembershipConfig)
    probe_interval_s = 1.5            # any MembershipConfig field overrides the preset

    [sites.snellius]                  # a site whose peer runs where other sites can dial it
    listen = "0.0.0.0:7001"
    advertise = "sitemesh.snellius.example.org:7001"  # address other sites dial (defaults to listen)
    relay_listen = "0.0.0.0:7100"     # also relay for outbound sites (default: no relay)

    [sites.lumi]                      # compute nodes accept no inbound connection: lumi dials out
    listen = "127.0.0.1:7001"         # where this site's gRPC server binds (only its tunnels reach it)
    reach = "outbound"                # direct (default) | outbound: reached through its relays
    relays = ["sitemesh.snellius.example.org:7100", "relay.example.org:7100"]
    proxy = "http://proxy.lumi.example:3128"  # HTTP CONNECT proxy for all it dials (default: https_proxy)
    join = ["sitemesh.snellius.example.org:7001"]     # seeds: any running member
    data_dir = "/scratch/project_x/sitemesh"
    accelerator = "4x MI250X"
    tokens_per_s = 0.0
    certs = "/scratch/project_x/certs"  # ca.crt, lumi.crt, lumi.key from `ops certs` (mutual TLS)
    metrics_listen = "0.0.0.0:9101"   # Prometheus /metrics (default: no endpoint)
    exchange_plane = "bulk"           # bulk | grpc: where pseudo-gradient chunks travel (default bulk)
    overlap = true                    # false: train each round only once the last one's θ is here

`[sites.NAME.slurm]` and `[placement]` belong to `ops` (ops/placement/config.py); this module
checks only that they are tables.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 sites only
    import tomli as tomllib

from peer.core.election import ElectionConfig
from peer.exchange.planes import DEFAULT_PLANE, PLANES
from peer.core.membership import MembershipConfig
from peer.core.lease_config import LeaseConfig
from peer.core.rounds import RoundsConfig
from peer.outer_config import OuterConfig
from peer.trainer.config import TrainerConfig
from peer.transport import route

_ADDRESS_RE = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")
PRESETS = ("lan", "wan", "local_test")
REACH = ("direct", "outbound")
"""How other sites reach a peer: dialling its address, or through relays it dials out to."""
"""Named timing presets; each names a MembershipConfig, an ElectionConfig and a LeaseConfig classmethod."""
# Tables of the run file that other components own; the peer accepts them without reading them.
_FOREIGN_TOP = {"placement", "trainer", "data", "model"}
_FOREIGN_SITE = {"slurm"}


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message says what and where."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """Splits `host:port` (IPv6 in brackets) and validates the port range."""
    m = _ADDRESS_RE.match(text.strip())
    if not m:
        raise ConfigError(f"malformed {what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7001 or [::1]:7001")
    port = int(m.group("port"))
    if port > 65535:
        raise ConfigError(f"malformed {what} {text!r}: port {port} is out of range 0-65535")
    return m.group("host"), port


def check_peer_address(text: str, what: str = "address") -> None:
    """A peer's dial address: `host:port`, or relay://SITE@RELAYS for a site reached through relays
    (peer/transport/route.py); ConfigError saying what is wrong."""
    if text.startswith(route.SCHEME):
        try:
            route.parse(text)
        except route.BadRoute as err:
            raise ConfigError(f"malformed {what}: {err}") from None
    else:
        parse_address(text, what)


@dataclass(frozen=True)
class PeerConfig:
    """Everything `peer serve` needs, after merging the run file and command-line flags."""

    site: str
    """This site's name; unique in the run and stable across restarts."""
    listen: str = "127.0.0.1:0"
    """host:port the gRPC server binds; port 0 picks a free port (printed at start-up)."""
    advertise: str = ""
    """host:port other members dial; empty means the bound listen address."""
    join: tuple[str, ...] = ()
    """Seed addresses; empty means start a new mesh alone."""
    data_dir: Path | None = None
    """Where this site keeps its durable state (commit log, checkpoints); None for a throwaway peer."""
    accelerator: str = "cpu"
    """Free text describing the accelerators, gossiped to other sites."""
    tokens_per_s: float = 0.0
    """Measured training throughput, gossiped to other sites (0 = unknown)."""
    run_name: str = "sitemesh"
    """Name of the run, shown by `ops status`."""
    membership: MembershipConfig = field(default_factory=MembershipConfig.lan)
    """Failure-detector timings."""
    election: ElectionConfig = field(default_factory=ElectionConfig.lan)
    """Election timeouts, heartbeat and lease timings."""
    leases: LeaseConfig = field(default_factory=LeaseConfig.lan)
    """Data-lease (DARL) timings: ttl, renewal period, retries."""
    round_interval_s: float = 0.0
    """Leader commits a round with no contributors this often (0 = off): a mesh without trainers
    still exercises election, replication and recovery (tests). Ignored when `trainer` is set."""
    trainer: TrainerConfig | None = None
    """This site trains (model, data, inner loop); None: the peer only coordinates."""
    rounds: RoundsConfig | None = None
    """Outer-round scheduling (H, grant size, deadline); required with `trainer`."""
    outer: OuterConfig = field(default_factory=OuterConfig)
    """Outer Nesterov step and checkpoint cadence."""
    join_timeout_s: float = 30.0
    """How long to keep retrying unreachable seeds (exponential backoff) before giving up."""
    certs: Path | None = None
    """Directory with `ca.crt`, `<site>.crt`, `<site>.key` (ops certs): serve and dial with mutual TLS."""
    insecure: bool = False
    """Plaintext gRPC with no peer identity: anyone who reaches the port is a member. Must be asked
    for explicitly; exactly one of `certs` and `insecure` is set."""
    metrics_listen: str = ""
    """host:port of the Prometheus /metrics endpoint (port 0 picks one); empty: no endpoint."""
    exchange_plane: str = DEFAULT_PLANE
    """"bulk": serve and fetch pseudo-gradient chunks over the bulk data plane (plain TCP, TLS under
    mutual TLS; gRPC where a peer offers none); "grpc": FetchChunks only
    (docs/decisions/exchange-bulk-plane.md)."""
    trainer_threads: int | None = None
    """Torch intra-op threads of the trainer worker; None: torch's default (one per core). Several
    sites on one machine (ops local_mesh) must share its cores: OpenMP threads spin-waiting for a
    core another trainer holds made a step ~10x slower (docs/decisions/trainer-cpu-fp32-one-thread.md)."""
    reach: str = "direct"
    """"direct": other sites dial `advertise`; "outbound": this site accepts no inbound connection
    and is reached through `relays`, to which it holds tunnels it dialled out (peer/transport/tunnel.py);
    it advertises relay://SITE@RELAYS (peer/transport/route.py)."""
    relays: tuple[str, ...] = ()
    """host:port of the relays an outbound site holds tunnels to (`peer serve --role relay`, or a
    direct site's `relay_listen`): name two or more, so no relay is a single point of failure."""
    proxy: str = ""
    """HTTP CONNECT proxy every connection this peer opens goes through ("http://host:port"), for
    compute nodes that reach out only through one; empty: the environment's https_proxy, if any
    (no_proxy honoured)."""
    relay_listen: str = ""
    """host:port where this site also relays for outbound sites (it must be dialable there); empty: none."""
    overlap: bool = True
    """Train round r+1 while round r is exchanged and committed, folding θ_r in when it is applied
    (RoundsConfig.overlap, docs/decisions/rounds-overlap-fold.md); false: strictly serial rounds."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", self.site):
            raise ConfigError(
                f"bad site name {self.site!r}: use letters, digits, '.', '_' or '-' (at most 63)"
            )
        parse_address(self.listen, "listen address")
        if self.advertise:
            parse_address(self.advertise, "advertise address")
        for seed in self.join:
            check_peer_address(seed, "seed address")
        if (self.trainer is None) != (self.rounds is None):
            raise ConfigError("trainer and rounds must be set together")
        if self.round_interval_s < 0:
            raise ConfigError(f"round_interval_s must be >= 0, got {self.round_interval_s}")
        if (self.certs is None) == (not self.insecure):
            raise ConfigError(
                "give certificates (--certs DIR, made by `ops certs init/issue`) or ask for plaintext "
                "explicitly with --insecure" if self.certs is None else "--certs and --insecure exclude each other"
            )
        if self.metrics_listen:
            parse_address(self.metrics_listen, "metrics address")
        if self.trainer_threads is not None and self.trainer_threads < 1:
            raise ConfigError(f"trainer_threads {self.trainer_threads}: give 1 or more (or leave it unset)")
        if not isinstance(self.overlap, bool):
            raise ConfigError(f"overlap {self.overlap!r}: use true or false")
        if self.exchange_plane not in PLANES:
            raise ConfigError(f"exchange_plane {self.exchange_plane!r}: use one of {', '.join(PLANES)}")
        if self.join_timeout_s <= 0:
            raise ConfigError(f"join_timeout_s must be > 0, got {self.join_timeout_s}")
        self._check_reach()

    def training(self) -> tuple[TrainerConfig, RoundsConfig] | None:
        """The trainer and the rounds of a peer that trains (set together); None for one that does
        not. The node builds its training from it, and the head start its trainer worker."""
        return None if self.trainer is None or self.rounds is None else (self.trainer, self.rounds)

    def _check_reach(self) -> None:
        if self.reach not in REACH:
            raise ConfigError(f"reach {self.reach!r}: use one of {', '.join(REACH)}")
        for relay in self.relays:
            parse_address(relay, "relay address")
        if self.relay_listen:
            parse_address(self.relay_listen, "relay_listen address")
        if self.proxy:
            try:
                route.proxy_hop(self.proxy)
            except route.BadRoute as err:
                raise ConfigError(str(err)) from None
        if self.reach == "direct":
            if self.relays:
                raise ConfigError("relays are for reach = \"outbound\" sites: set reach = \"outbound\" or drop relays")
            return
        if not self.relays:
            raise ConfigError("reach = \"outbound\" needs relays (host:port of `peer serve --role relay` or a "
                              "direct site's relay_listen; two or more so none is a single point of failure)")
        if self.advertise:
            raise ConfigError("an outbound site advertises its relays (relay://SITE@RELAYS), not an address: "
                              "drop advertise, or set reach = \"direct\"")
        if self.insecure:
            raise ConfigError("an outbound site proves itself to its relays with its certificate: give --certs")

    def dial_address(self, bound: str) -> str:
        """What other sites dial to reach this peer, whose server is bound at `bound`."""
        if self.reach == "outbound":
            return route.relayed_address(self.site, self.relays)
        return self.advertise or bound


def _check_keys(table: dict[str, Any], allowed: set[str], where: str, path: Path) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(sorted(allowed))}"
        )


def _membership_from(table: dict[str, Any], path: Path) -> MembershipConfig:
    table = dict(table)
    preset = table.pop("preset", "lan")
    if preset not in PRESETS:
        raise ConfigError(f"{path}: [membership] preset {preset!r} unknown; use one of {', '.join(PRESETS)}")
    base = getattr(MembershipConfig, preset)()
    fields = {f.name for f in dataclasses.fields(base)}
    _check_keys(table, fields, "[membership]", path)
    try:
        return dataclasses.replace(base, **table)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path}: [membership]: {err}") from err


_SITE_KEYS = {"listen", "advertise", "join", "data_dir", "accelerator", "tokens_per_s", "certs", "metrics_listen",
              "exchange_plane", "overlap", "reach", "relays", "proxy", "relay_listen"}


def load(path: Path, site: str, overrides: dict[str, Any]) -> PeerConfig:
    """Reads the run file, picks `[sites.<site>]`, applies command-line `overrides` (None = unset)."""
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"config file {path} does not exist") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err
    _check_keys(doc, {"run", "membership", "sites"} | _FOREIGN_TOP, "the top level", path)
    run = doc.get("run", {})
    _check_keys(run, {"name", "insecure"}, "[run]", path)
    sites = doc.get("sites", {})
    if site not in sites:
        known = ", ".join(sorted(sites)) or "none"
        raise ConfigError(f"{path}: no [sites.{site}] section (sites in the file: {known})")
    section = dict(sites[site])
    for foreign in _FOREIGN_SITE:
        section.pop(foreign, None)
    _check_keys(section, _SITE_KEYS, f"[sites.{site}]", path)
    preset = doc.get("membership", {}).get("preset", "lan")
    values: dict[str, Any] = {
        "site": site,
        "run_name": run.get("name", "sitemesh"),
        "insecure": bool(run.get("insecure", False)),
        "membership": _membership_from(doc.get("membership", {}), path),
        "election": getattr(ElectionConfig, preset)(),
        "leases": getattr(LeaseConfig, preset)(),
    }
    for key in _SITE_KEYS:
        if key in section:
            values[key] = section[key]
    values.update({k: v for k, v in overrides.items() if v is not None})
    return from_values(values)


def from_values(values: dict[str, Any]) -> PeerConfig:
    """Builds a PeerConfig from plain values, normalising types (lists, paths)."""
    values = dict(values)
    for key in ("join", "relays"):
        if key in values:
            values[key] = tuple(values[key])
    for key in ("data_dir", "certs"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    try:
        return PeerConfig(**values)
    except TypeError as err:
        raise ConfigError(str(err)) from err
