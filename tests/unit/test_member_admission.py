"""Who a peer lets into its membership core (peer/core/member_admission.py), table-driven on a manual clock.

    .venv/bin/python -m pytest -q tests/unit/test_member_admission.py
"""

from __future__ import annotations

from peer.core.agreement import TrainingIdentity
from peer.core.member_admission import MemberAdmission, Refusal
from peer.core.membership_types import MemberMeta, MemberState, MemberUpdate, MemberView, Ping, PushPull

ME = "a:1"
RUN = TrainingIdentity(model={"preset": "micro"}, tokenizer={"vocab": 1}, data={"tag": "c4"})
OTHER = TrainingIdentity(model={"preset": "small"}, tokenizer={"vocab": 1}, data={"tag": "c4"})


def view(site: str, address: str, state: MemberState = MemberState.ALIVE, heard: float = 100.0) -> MemberView:
    return MemberView(site, address, state, 0, heard, None)


def ping(site: str, address: str) -> Ping:
    return Ping(seq=1, from_site=site, from_address=address, target_site="a")


def push(site: str, address: str, *others: str, identity: TrainingIdentity | None = None) -> PushPull:
    meta = MemberMeta(site, address, labels=identity.labels() if identity else ())
    updates = [MemberUpdate(site, MemberState.ALIVE, 0, meta, site)]
    updates += [MemberUpdate(o, MemberState.ALIVE, 0, None, site) for o in others]
    return PushPull(from_site=site, from_address=address, members=tuple(updates))


MEMBERS = [view("a", ME), view("b", "b:1", heard=99.0)]


def test_a_second_live_process_under_a_known_site_is_refused_until_the_first_is_quiet() -> None:
    gate = MemberAdmission("a", max_members=8, probe_interval_s=1.0)
    refused = gate.check(ping("b", "b:2"), ME, MEMBERS, now=100.0, identity=RUN)
    assert refused is not None and not refused.final and "b is live at b:1" in refused.reason
    assert gate.check(ping("b", "b:1"), ME, MEMBERS, now=100.0, identity=RUN) is None, "the member itself"
    assert gate.check(ping("b", "b:2"), ME, MEMBERS, now=102.5, identity=RUN) is None, \
        "3 probe periods quiet: a restarted site is welcome"
    suspect = [view("a", ME), view("b", "b:1", MemberState.SUSPECT)]
    assert gate.check(ping("b", "b:2"), ME, suspect, now=100.0, identity=RUN) is None


def test_this_sites_own_name_from_another_address_is_refused() -> None:
    gate = MemberAdmission("a", max_members=8, probe_interval_s=1.0)
    refused = gate.check(ping("a", "a:9"), ME, MEMBERS, now=100.0, identity=RUN)
    assert refused == Refusal(f"site a is this peer ({ME}); a second process with its name is refused")


def test_rumours_of_more_new_sites_than_the_table_holds_are_refused_whole() -> None:
    gate = MemberAdmission("a", max_members=4, probe_interval_s=1.0)
    assert gate.check(push("c", "c:1", "d"), ME, MEMBERS, now=100.0, identity=None) is None, "2 + 2 = 4 fits"
    refused = gate.check(push("c", "c:1", "d", "e"), ME, MEMBERS, now=100.0, identity=None)
    assert refused is not None and "3 new members would pass the limit of 4" in refused.reason


def test_a_sender_of_another_run_is_refused_for_good_and_logged_once_per_reason() -> None:
    gate = MemberAdmission("a", max_members=8, probe_interval_s=1.0)
    first = gate.check(push("c", "c:1", identity=OTHER), ME, MEMBERS, now=100.0, identity=RUN)
    assert first is not None and first.final and first.first and "model" in first.reason
    again = gate.check(push("c", "c:1", identity=OTHER), ME, MEMBERS, now=101.0, identity=RUN)
    assert again is not None and again.final and not again.first, "the same reason is not logged twice"
    assert gate.check(push("c", "c:1", identity=RUN), ME, MEMBERS, now=102.0, identity=RUN) is None, "fixed"
    back = gate.check(push("c", "c:1", identity=OTHER), ME, MEMBERS, now=103.0, identity=RUN)
    assert back is not None and back.first, "refused again after it was let in: logged again"
    assert gate.check(push("c", "c:1"), ME, MEMBERS, now=104.0, identity=RUN) is None, "no trainer: not checked"
