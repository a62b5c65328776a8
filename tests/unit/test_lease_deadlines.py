"""The lease cores report every deadline their ticks act on: executors (`peer/node.py`, the whole-peer
simulator) tick them only at `next_deadline()` and after messages, never on a fixed period.

Two checks, on the in-memory mesh with lossy delivery: wherever a tick would send something, the
deadline it reported is due (a deadline it forgot would leave that send to some unrelated wake-up);
and a mesh ticked only at its reported deadlines trains and commits every sample of the epoch
exactly once.
"""

from __future__ import annotations

import copy
import random
from collections import Counter

from peer.core.election import SiteId
from peer.core.lease_types import Send
from tests.unit.test_leases_mesh import Mesh

SITES = [SiteId(s) for s in "abc"]


def _deadline(m: Mesh, s: SiteId) -> float:
    times = [m.owners[s].next_deadline(), m.clients[s].next_deadline()]
    return min((t for t in times if t is not None), default=float("inf"))


def _deliver(m: Mesh, rng: random.Random, drop: float) -> None:
    """Delivers what is queued, losing each message with probability `drop`."""
    while m.queue:
        frm, e = m.queue.popleft()
        if rng.random() < drop:
            continue
        m.delivered.append((e.to, e.msg))
        m.effects(e.to, m.owners[e.to].receive(e.msg, m.now))
        m.effects(e.to, m.clients[e.to].receive(e.msg, m.now))


def _acts(m: Mesh, s: SiteId) -> bool:
    """Whether ticking `s` now would send anything (on copies: the mesh is left as it is)."""
    owner, client = copy.deepcopy(m.owners[s]), copy.deepcopy(m.clients[s])
    sent = [e for e in [*owner.tick(m.now), *client.tick(m.now)] if isinstance(e, Send)]
    return bool(sent)


def _train_epoch(seed: int, drop: float, check_every_step: bool) -> tuple[Counter[tuple[int, int]], float]:
    """Three sites train from leases (3 samples every 0.3 s each) and end a round every 1.5 s, which
    commits at the next round's end with what was vouched by then;
    each site's cores are ticked only when their reported deadline is due. Returns how often each
    (block, sample) was committed and the time the epoch took."""
    rng = random.Random(seed)
    m = Mesh("abc")
    m.set_view("abc")
    _deliver(m, rng, 0.0)
    committed: Counter[tuple[int, int]] = Counter()
    next_train, next_round, round_ = 0.3, 1.5, 0
    total = m.ledgers[SITES[0]].total
    while sum(committed.values()) < total:
        assert m.now < 600, f"stalled at {sum(committed.values())} of {total} samples committed"
        due = {s: _deadline(m, s) for s in SITES}
        m.now = max(m.now, min([*due.values(), next_train, next_round]))
        if check_every_step:
            for s in SITES:
                if due[s] > m.now:
                    assert not _acts(m, s), f"{s} would act at {m.now:.3f} but reported {due[s]:.3f}"
        for s in SITES:
            if due[s] <= m.now:
                m.effects(s, m.owners[s].tick(m.now))
                m.effects(s, m.clients[s].tick(m.now))
        if m.now >= next_train:
            next_train = m.now + 0.3
            for s in SITES:
                m.clients[s].next_samples(3, m.now)
        if m.now >= next_round:
            # Round r's claims had a whole round to be vouched (resent when lost): what is vouched
            # by now commits, the rest is excluded and its samples go back.
            next_round = m.now + 1.5
            if round_ > 0:
                contributions = [c for s in SITES if (c := m.clients[s].offer(round_)) is not None]
                for c in contributions:
                    for r in c.ranges:
                        committed.update((r.block_id, i) for i in range(r.start, r.end))
                for s in SITES:
                    m.ledgers[s].apply(round_, [(c.site, c.ranges) for c in contributions])
                    m.effects(s, m.owners[s].on_commit(m.now))
                    m.effects(s, m.clients[s].on_commit(m.now))
            round_ += 1
            for s in SITES:
                m.effects(s, m.clients[s].end_round(round_, m.now))
        _deliver(m, rng, drop)
    return committed, m.now


def test_a_tick_that_would_send_was_reported_as_due() -> None:
    for seed in range(6):
        _train_epoch(seed, drop=0.1, check_every_step=True)


def test_a_mesh_ticked_only_at_its_deadlines_commits_every_sample_once() -> None:
    for seed in range(10):
        committed, _ = _train_epoch(seed, drop=0.15, check_every_step=False)
        assert max(committed.values()) == 1, f"seed {seed}: a sample committed twice"
        assert len(committed) == Mesh("abc").ledgers[SITES[0]].total
