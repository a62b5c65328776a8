"""Whole-peer simulation of outer rounds: the real round, consensus and lease cores of N sites.

A seeded run (`PeerSim`) of N simulated sites (`PeerNode`, peer/sim/peer_node.py: the real cores
and a fake trainer, exchange and disk in simulated time) in a shared world (`World`,
peer/sim/peer_world.py: membership's verdicts, the disks, the committed truth and the invariants
checked after every event), with message loss, duplication and reordering, skewed clocks and the
seed's fault schedule (`FaultSchedule`, peer/sim/peer_faults.py: kills, pauses, partitions, leaves,
restarts). Only by name (`--faults all,faulty`): a faulty site, a member or a certificate of the run
that never joined, sends protocol-valid but false messages, under the run's keys (peer/sim/faulty.py).
Timings and `PeerSimConfig` are in peer/sim/peer_config.py. This module is the entry point of
`ops simulate --protocol peer`: one seed, its fault kinds, its replay flags.

    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all
    ops simulate --protocol peer --members 5 --seed 7 --trace
    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all,faulty
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from peer.core.consensus import DurableState
from peer.core.election import SiteId
from peer.core.vouchers import VoucherKeys
from peer.sim.clock import NodeClock
from peer.sim.faults import parse_faults
from peer.sim.peer_config import EXTRA_KINDS, PeerSimConfig
from peer.sim.peer_faults import FaultSchedule
from peer.sim.peer_node import PeerNode
from peer.sim.peer_world import PeerChecker, World
from peer.sim.runner import RunResult

COUNTERS = ("opens_lost_to_restart", "opens_resent", "faulty_sent", "faulty_refused")
"""RunResult.stats a run adds, totalled by `ops simulate`: round opens the leader sent to a site down
for a fast restart, and opens re-sent to a site that came back up (World's counters of the same names);
the faulty site's lies sent, and refused by honest peers (`faulty`: FaultySite.sent, .refused)."""
OPT_IN = ("faulty",)
"""Faults only named ones run, not `all`: `faulty` (peer/sim/faulty.py, a site that lies; it needs
the run's keys). `all` stays a sweep of honest sites, where any implausible refusal is a bug."""


class PeerSim(World):
    """One seeded run: the world, its sites started from their disks and the seed's fault schedule."""

    def run(self) -> RunResult:
        cfg = self.cfg
        founders = self.names[:-1]
        skew = "skew" in cfg.faults
        for n in self.names:
            clock = NodeClock(self.rng.uniform(0, 100), 1 + self.rng.uniform(-0.001, 0.001)) if skew else NodeClock()
            if n in founders:
                fresh = DurableState.fresh({f: f for f in founders})
                self.disks[n].store.save_hard_state(fresh.hard)
                self.disks[n].store.write_log(1, tuple(fresh.entries))
                self.live.add(n)
            self.sim.add_node(n, partial(self._start, n), at=0.0 if n in founders else 1e9, clock=clock)
        rng, at = self.rng, self.sim.schedule
        at(rng.uniform(3, 12), lambda: self.join(self.names[-1]), "late join")
        FaultSchedule(self).plan()
        res = self.sim.run(cfg.max_time, PeerChecker(self))
        lies = (sum(self.faulty.sent.values()), sum(self.faulty.refused.values())) if self.faulty else (0, 0)
        res.stats.update(dict(zip(COUNTERS, (self.opens_lost_to_restart, self.opens_resent, *lies), strict=True)))
        return res

    def _start(self, name: SiteId, now: float) -> tuple[PeerNode, list[Any]]:
        node = PeerNode(name, self, now)
        return node, node.started


def simulate(seed: int, cfg: PeerSimConfig | None = None, trace: Callable[[str], None] | None = None,
             keys: Mapping[str, VoucherKeys] | None = None) -> tuple[PeerSim, RunResult]:
    world = PeerSim(seed, cfg or PeerSimConfig(), trace, keys)
    return world, world.run()


def parse_kinds(spec: str) -> tuple[str, ...]:
    """`ops simulate --faults` words plus `leave` and `restart` (`all` includes them) and `faulty`
    (only by name)."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    extra = tuple(k for k in EXTRA_KINDS if k in words or "all" in words)
    extra += tuple(k for k in OPT_IN if k in words)
    ours = (*EXTRA_KINDS, *OPT_IN)
    return parse_faults(",".join(w for w in words if w not in ours) or "none") + extra


def site_names(members: int) -> list[str]:
    """Every site a run of `members` may name: its sites and one that never joins (the faulty one)."""
    return [f"s{i}" for i in range(members + 1)]


def run_seed(args: argparse.Namespace, seed: int, trace: Callable[[str], None] | None = None,
             keys: Mapping[str, VoucherKeys] | None = None) -> RunResult:
    """One seed for `ops simulate --protocol peer` (`--members` sites, `--faults`; `keys` for
    `site_names(members)`, which `faulty` needs)."""
    _, res = simulate(seed, PeerSimConfig(sites=args.members, faults=parse_kinds(args.faults)), trace, keys)
    return res


def replay_flags(args: argparse.Namespace) -> list[str]:
    return ["--members", str(args.members), "--faults", args.faults]
