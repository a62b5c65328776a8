"""A site of the run cannot credit itself work it was not given (issue 38, probe 5): three real
`peer serve --train` processes with mutual TLS train a micro model, and the holder of site b's real
certificate (a's when b leads) sends the leader forged round reports over the wire, as a modified
build of b would.

The probe once had a site report 10x its tokens and whole blocks it never leased, with vouchers it
wrote itself: it was admitted in every round, took 85% of the outer step and `ops audit` said ok.
Now (docs/decisions/security-work-credit.md) the leader excludes each forged report with its reason
(in its log), honest rounds keep committing (the test prints the committed round before and after
each probe), no commit ever holds a forged claim, and `ops audit` over every data dir finds the
epoch committed exactly once with every sample vouched by its owner.

Each forged report is sent the moment the leader opens a round (its log says "round N open"), so it
is b's first report of that round (the leader takes one per site): b's honest one of that round is
then ignored and its samples go back to free, which costs the run one round of b's work.

    .venv/bin/python -m pytest -q -s tests/integration/test_hostile_credit.py
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from peer.core import vouchers
from peer.core.commitlog import RoundCommit, SampleRange
from peer.core.election import Epoch, Header, SiteId
from peer.core.lease_types import BlockId, Gen, Span, Voucher
from peer.core.ring import RingView
from peer.core.rounds import Contribution
from peer.trainer.blocks import BlockIndex
from peer.trainer.config import DataConfig
from peer.transport.channels import Credentials
from peer.transport.rounds_rpc import ROUNDS
from peer.transport.wire import to_proto
from peer.vouching import keys_of
from tests.integration.peers import Cluster, audit, commits, ops, wait_for
from tests.integration.test_security import _raw

PRESET = "lan"
DOCS = 24  # 420 samples in blocks of 64 (and one of 36): no site runs out of blocks to train, and so
# none takes over the tails the probes name, until long after the last probe
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "8", "--batch-size", "1",
         "--round-deadline", "60", "--start-sites", "3", "--overlap", "off",  # off: b reports after the open
         "--trainer-threads", "1"]  # three trainers on a small machine
STEP_S = 60.0
SEQ_LEN = DataConfig.shipped().seq_len  # every sample is this many tokens: a report's most


def _blocks() -> dict[int, int]:
    return {b.block_id: b.num_samples for b in BlockIndex(DataConfig.shipped(max_documents=DOCS)).blocks}


def _vouches(cluster: Cluster) -> list[dict[str, Any]]:
    """The VOUCH events of every owner's lease ledger so far."""
    ledgers = [cluster.workdir / s / "leases" / "ledger.jsonl" for s in cluster.peers]
    return [json.loads(line) for path in ledgers if path.exists() for line in path.read_text().splitlines()
            if '"vouch"' in line]


def _ring(cluster: Cluster) -> RingView:
    """The newest ring view the owners vouched under."""
    return RingView.of(max(v["ring_version"] for v in _vouches(cluster)), cluster.peers)


def _leaders(log: str) -> list[str]:
    """Every "leader of epoch N: X" a peer logged, in order."""
    return re.findall(r"leader of epoch \d+: (\S+)$", log, re.M)


def _epoch(log: str, leader: str) -> int:
    """The epoch `leader` leads, by its own log."""
    return int(re.findall(rf"leader of epoch (\d+): {leader}$", log, re.M)[-1])


def _committed(log: str) -> int:
    """The last round a peer's log says it committed ("round N committed")."""
    return max((int(n) for n in re.findall(r": round (\d+) committed ", log)), default=0)


def _opens(log: str) -> list[int]:
    """The rounds the leader opened, by its log ("round N open")."""
    return [int(n) for n in re.findall(r": round (\d+) open$", log, re.M)]


@dataclass(frozen=True)
class Hostile:
    """`site`, a follower of `leader`'s run, sending the leader forged reports with its real certificate."""

    cluster: Cluster
    leader: str
    site: str

    def tail(self, block: int, n: int) -> SampleRange:
        """The last `n` samples of `block`, checked not committed yet (holders train a block from its
        start, and a site that takes over its tail from a slower holder is no faster than 8 samples a round)."""
        size = _blocks()[block]
        tail = SampleRange(block, size - n, size)
        for commit in commits(self.cluster.workdir / self.leader):
            for c in commit.contributors:
                for r in c.ranges:
                    assert r.block_id != block or r.end <= tail.start, f"block {block}'s tail is committed: more data"
        return tail

    def forger(self, tokens_x: int, block: int, owner: str, sign_as: str | None) -> Callable[[int, int], Contribution]:
        """(round, epoch) -> this site's report of the tail of `block` for that round, vouched by `owner`
        (signed with the key of `sign_as`, unsigned for None), claiming `tokens_x` times the tokens its
        samples hold. All but the round is made here, so the report leaves at once when the round opens."""
        r = self.tail(block, 4)
        version = _ring(self.cluster).version
        keys = keys_of(Credentials.from_dir(self.cluster.certs, sign_as)) if sign_as is not None else None
        address = self.cluster.peers[self.site].address

        def forge(round_: int, epoch: int) -> Contribution:
            v = Voucher(BlockId(block), Gen(1), (Span(r.start, r.end),), SiteId(self.site), round_, version,
                        SiteId(owner))
            return Contribution(Header(SiteId(self.site), address, Epoch(epoch), round_ - 1), round_, self.site,
                                address, tokens_x * r.num_samples * SEQ_LEN, (r,), b"\x5a" * 32,
                                (vouchers.signed(v, keys),))

        return forge

    def probe(self, what: str, forge: Callable[[int, int], Contribution], expect: str, after: int) -> int:
        """Sends `forge(round, epoch)` the moment the leader opens a round after `after`, until the leader
        decides a round with it (this site's honest report may win the race): returns that round, whose
        exclusion reason in the leader's log contains `expect`, once it is committed."""
        lead = self.cluster.peers[self.leader]
        creds = Credentials.from_dir(self.cluster.certs, self.site)
        before, epoch = _committed(lead.log()), _epoch(lead.log(), self.leader)
        seen = after
        deadline = time.monotonic() + STEP_S
        while time.monotonic() < deadline:
            opened = max(_opens(lead.log()), default=0)
            if opened <= seen:
                time.sleep(0.01)
                continue
            seen = opened
            msg = forge(opened, epoch)
            route = ROUNDS.route_of(msg)
            err = _raw(lead.address, creds, f"/{ROUNDS.full_name}/{route.method}",
                       to_proto(msg, route.proto_cls).SerializeToString())
            assert err is None, err
            line = self._decided(opened)
            if line is None:
                continue  # the site's honest report came first: the next round
            assert expect in line, line
            self._committed(opened, what)
            print(f"{what}: committed round {before} -> {_committed(lead.log())}, leader {_leaders(lead.log())[-1]}, "
                  f"epoch {_epoch(lead.log(), self.leader)}; {line.split(': ', 1)[1]}")
            return opened
        raise AssertionError(f"no round of the leader took the forged report ({what}) within {STEP_S:.0f} s")

    def _committed(self, round_: int, what: str) -> None:
        lead = self.cluster.peers[self.leader]
        wait_for(lambda: _committed(lead.log()) >= round_, STEP_S, f"round {round_} to commit after {what}")

    def _decided(self, round_: int) -> str | None:
        """Waits for the leader to decide `round_`: its line excluding this site, None if it excluded
        none of its reports. Fails at once if the leadership moved (a machine too loaded to renew it)."""
        lead = self.cluster.peers[self.leader]
        mine = f"round {round_}: {self.site}: excluded: "

        def decided() -> bool:
            log = lead.log()
            assert _leaders(log)[-1] == self.leader, f"the leadership moved: {_leaders(log)[-3:]}"
            return mine in log or f"round {round_}: proposing" in log

        wait_for(decided, STEP_S, f"round {round_} to be decided")
        return next((ln for ln in lead.log().splitlines() if mine in ln), None)


@pytest.mark.timeout(240)
def test_forged_reports_are_excluded_and_the_audit_finds_every_sample_once_and_vouched(
        tls_cluster: Cluster) -> None:
    cluster = tls_cluster
    a = cluster.start("a", extra=TRAIN)
    for site in ("b", "c"):
        cluster.start(site, join=[a.address], extra=TRAIN)
    wait_for(lambda: bool(_vouches(cluster)), STEP_S, "the first vouchers")
    leader = cluster.status(a.address)["leader"]
    lead = cluster.peers[leader]
    # b (a when b leads): a site that is the primary of one of the two blocks of 64 samples.
    h = Hostile(cluster, leader, "b" if leader != "b" else "a")
    ring = _ring(cluster)
    primary = {b: str(ring.primary(b)) for b in _blocks()}
    own = next(b for b, p in primary.items() if p == h.site and _blocks()[b] == 64)
    other = next(b for b, p in primary.items() if p != h.site and _blocks()[b] == 64)
    probes = [
        # (a) samples of a block the site is the primary of, vouched by itself (an owner is trusted
        # for its shard), but claiming 10x the tokens they hold: its weight in the outer step.
        ("10x tokens", h.forger(10, own, h.site, h.site),
         f"{h.site} claims {10 * 4 * SEQ_LEN} tokens for 4 samples of {SEQ_LEN} tokens (at most {4 * SEQ_LEN})"),
        # (b) samples of a block it is not the primary of, with a voucher it wrote: unsigned ...
        ("unsigned voucher", h.forger(1, other, primary[other], None),
         f"block {other}: the voucher of {primary[other]} carries no signature"),
        # ... and signed with its own key, as if it were the block's owner.
        (f"voucher signed by {h.site} as owner", h.forger(1, other, h.site, h.site),
         f"block {other}: the voucher is by {h.site}, but the block's owner in ring view {ring.version} is "
         f"{primary[other]}"),
    ]
    probed: list[int] = []
    for what, forge, expect in probes:
        probed.append(h.probe(what, forge, expect, after=probed[-1] if probed else _committed(lead.log())))

    wait_for(lambda: "run's data complete" in lead.log(), 120.0, "the data epoch to complete")
    print(f"data epoch complete: committed round {_committed(lead.log())}, leader {_leaders(lead.log())[-1]}")
    logged: list[RoundCommit] = commits(cluster.workdir / leader)
    for commit in logged:
        for c in commit.contributors:
            n = sum(r.num_samples for r in c.ranges)
            assert c.tokens == n * SEQ_LEN, f"round {commit.round}: {c.site} weighs {c.tokens} for {n} samples"
        if commit.round in probed:
            assert h.site not in {c.site for c in commit.contributors}, commit
            print(f"round {commit.round} (probed): outer step weights "
                  + ", ".join(f"{c.site} {c.tokens}" for c in commit.contributors))
    dirs = [cluster.workdir / s for s in ("a", "b", "c")]
    epoch = audit(*dirs)
    assert (epoch["duplicated"], epoch["lost"], epoch["unvouched"], epoch["unchecked"]) == (0, 0, 0, 0), epoch
    assert epoch["ended"] and epoch["committed_once"] == epoch["samples_total"] == sum(_blocks().values())
    table = ops("audit", *(arg for d in dirs for arg in ("--data-dir", str(d))))
    assert table.returncode == 0 and table.stdout.rstrip().endswith("ok"), table.stdout + table.stderr
    print(table.stdout)
    for p in cluster.peers.values():
        assert p.proc.poll() is None and "Traceback" not in p.log(), p.log()[-3000:]
