"""A site of the run cannot take another out of membership (issue 38, probe 4): real `peer serve`
processes with mutual TLS, sent membership rumours by the holder of a real site certificate.

One `Ping` from b to a once carried "c LEFT at incarnation 2^62": every peer believed it, and c's
refutation at 2^62 + 1 was refused at decode, so c was out of the run for good. Now a refuses
rumours no subject could refute and jumps no third party may make (peer/core/membership_guard.py,
docs/decisions/security-membership-counters.md), logs the refusal once, and c stays ALIVE and a
voter while the same leader keeps committing rounds (the test prints the committed round before and
after each probe). A believable lie (a SUSPECT one above c's incarnation) is believed, and c
refutes it within seconds.

    .venv/bin/python -m pytest -q -s tests/integration/test_hostile_membership.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peer.core.membership_types import MemberState, MemberUpdate, Ping
from peer.transport.channels import Credentials
from peer.transport.membership_rpc import MEMBERSHIP
from peer.transport.wire import to_proto
from tests.integration.peers import Cluster, wait_for
from tests.integration.test_hostile_site import _goes_on, _mesh
from tests.integration.test_security import _raw

REFUTE_S = 10.0


@pytest.fixture
def tls(tmp_path: Path):
    # LAN timings (elections after 1-2 s of silence, not 0.3-0.6 s): the probes must not be confused
    # with a leader change a loaded 2-core machine causes by stalling a process for half a second.
    c = Cluster(tmp_path, preset="lan", tls=True)
    yield c
    c.close()


def _ping(tls: Cluster, sender: str, to: str, *rumours: MemberUpdate) -> None:
    """One membership Ping from `sender` (with its real certificate, naming its real address, as its
    own process would) to `to`, carrying `rumours`: delivered (one-way), whatever `to` makes of it."""
    msg = Ping(1, sender, tls.peers[sender].address, to, rumours)
    route = MEMBERSHIP.route_of(msg)
    err = _raw(tls.peers[to].address, Credentials.from_dir(tls.certs, sender),
               f"/{MEMBERSHIP.full_name}/{route.method}", to_proto(msg, route.proto_cls).SerializeToString())
    assert err is None, err


def _member(tls: Cluster, at: str, site: str) -> dict[str, Any]:
    """`site` as the peer `at` sees it (state, incarnation)."""
    return next(m for m in tls.status(tls.peers[at].address)["members"] if m["site"] == site)


def _incarnation(tls: Cluster, site: str) -> int:
    """The highest incarnation any peer holds for `site`."""
    return max(int(_member(tls, p, site)["incarnation"]) for p in tls.peers)


def _c_is_in(tls: Cluster, below: int) -> None:
    """c is ALIVE and a voter on every peer, at an incarnation below `below`."""
    for p in tls.peers:
        seen = tls.status(tls.peers[p].address)
        c = next(m for m in seen["members"] if m["site"] == "c")
        assert c["state"] == "alive", (p, c)
        assert int(c["incarnation"]) < below, (p, c)
        assert "c" in seen["voters"], (p, seen["voters"])


def test_rumours_no_subject_could_refute_are_refused_and_a_lie_is_refuted(tls: Cluster) -> None:
    status = _mesh(tls)
    leader, epoch = status["leader"], status["epoch"]
    assert isinstance(leader, str) and isinstance(epoch, int)
    a = tls.peers["a"]
    held = _incarnation(tls, "c")

    # 1. "c LEFT at 2^62", relayed by b: above the limit c could refute at. Sent twice, logged once.
    left = MemberUpdate("c", MemberState.LEFT, 2**62, None, "b")
    _ping(tls, "b", "a", left)
    _ping(tls, "b", "a", left)
    _goes_on(tls, "c LEFT at incarnation 2^62 from b", leader, epoch)
    _c_is_in(tls, held + 1000)
    assert a.log().count("membership refused Ping (over limit) from b: rumour c LEFT@4611686018427387904: above "
                         "the incarnation limit") == 1, a.log()[-3000:]

    # 2. "c DEAD at c's + 5000", relayed by b: within the wire's bounds, but a jump only c may make.
    dead = MemberUpdate("c", MemberState.DEAD, held + 5000, None, "b")
    _ping(tls, "b", "a", dead)
    _goes_on(tls, f"c DEAD at incarnation {held} + 5000 from b", leader, epoch)
    _c_is_in(tls, held + 1000)
    assert a.log().count(f"membership refused Ping (jump) from b: rumour c DEAD@{held + 5000} relayed by b: more "
                         f"than 1000 above the {held} held") == 1, a.log()[-3000:]

    # 3. A believable lie, "c SUSPECT at c's + 1" from b: a believes it, c hears it and refutes.
    held = _incarnation(tls, "c")
    _ping(tls, "b", "a", MemberUpdate("c", MemberState.SUSPECT, held + 1, None, "b"))
    wait_for(lambda: f"member c: alive -> suspect (incarnation {held + 1})" in a.log(), REFUTE_S,
             "a to believe the SUSPECT")
    took = wait_for(lambda: all(m["state"] == "alive" and int(m["incarnation"]) > held + 1
                                for m in (_member(tls, p, "c") for p in tls.peers)),
                    REFUTE_S, "c to refute the suspicion on every peer")
    print(f"c SUSPECT at {held + 1} from b: refuted by c at {_incarnation(tls, 'c')} on every peer in {took:.1f} s")
    _goes_on(tls, "c SUSPECT from b, refuted", leader, epoch)
    _c_is_in(tls, held + 1000)
    for p in tls.peers.values():
        assert "-> dead" not in p.log() and "-> left" not in p.log(), p.log()[-3000:]
