"""The node's lease edge: routes of the Leases service, the boot counter, log entries -> ring views."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.core.commitlog import Contributor, Entry, RoundCommit, VoterChange
from peer.core.election import Epoch, Header, SiteId
from peer.gen.sitemesh.v1 import leases_pb2, rounds_pb2
from peer.core.lease_types import Gen, Message, Voucher, spans, to_ranges
from peer.core.lease_config import LeaseConfig
from peer.leasing import Leasing, next_boot
from peer.core.rounds import Contribution
from peer.core.samples import SampleRange
from peer.transport.leases_rpc import LEASES
from peer.transport.wire import from_proto, to_proto


def test_every_leases_rpc_has_a_route_and_every_message_type_one() -> None:
    methods = {m.name for m in leases_pb2.DESCRIPTOR.services_by_name["Leases"].methods}
    assert {r.method for r in LEASES.routes} == methods
    assert {r.core_cls for r in LEASES.routes} == set(Message.__args__)  # type: ignore[attr-defined]


def test_a_contribution_carries_its_vouchers_over_the_wire() -> None:
    c = Contribution(Header(SiteId("a"), "h:1", Epoch(2), 4), 5, "a", "h:1", 640,
                     (SampleRange(7, 0, 5),), b"\x02" * 32, (Voucher(7, Gen(2**32 + 1), spans((0, 5))),))
    assert from_proto(to_proto(c, rounds_pb2.Contribution), Contribution) == c


def test_boot_counts_process_starts_and_refuses_a_corrupt_file(tmp_path: Path) -> None:
    assert [next_boot(tmp_path) for _ in range(3)] == [0, 1, 2]
    (tmp_path / "boot").write_text("x")
    with pytest.raises(ValueError, match="boot is corrupt"):
        next_boot(tmp_path)


def _leasing(tmp_path: Path, sent: list[tuple[str, object]]) -> Leasing:
    return Leasing("a", {1: 4, 2: 4}, LeaseConfig.local_test(), tmp_path, lambda to, msg: sent.append((to, msg)))


def _change(index: int, site: str, add: bool = True) -> Entry:
    return Entry(index, Epoch(0), VoterChange(SiteId(site), f"{site}:1", add, "test"))


def _view_entries(*sites: str) -> list[Entry]:
    return [_change(i, s) for i, s in enumerate(sites, 1)]


def test_a_first_process_is_trusted_and_a_restarted_one_rebuilds(tmp_path: Path) -> None:
    sent: list[tuple[str, object]] = []
    first = _leasing(tmp_path, sent)
    first.run(first.cores.apply_entries(_view_entries("a"), 0.0))
    assert first.owner.serving == {1, 2}, "the run's first view: the log is the whole truth"
    assert first.owner.live_since == 0 and not (tmp_path / "ledger.jsonl").exists()
    restarted = _leasing(tmp_path, sent)
    assert restarted.boot == 1 and restarted.owner.live_since is None
    restarted.run(restarted.cores.apply_entries(_view_entries("a"), 0.0))
    # Alone and amnesiac, it cannot read a majority of earlier owners: it rebuilds from the log.
    assert (tmp_path / "ledger.jsonl").read_text().count('"rebuild"') == 2


def test_a_site_the_log_knew_before_its_data_dir_was_lost_is_not_trusted(tmp_path: Path) -> None:
    sent: list[tuple[str, object]] = []
    joiner = _leasing(tmp_path / "j", sent)
    assert joiner.boot == 0 and joiner.owner.live_since == 0
    joiner.run(joiner.cores.apply_entries([_change(1, "b"), _change(2, "a"), _change(3, "a", add=False), _change(4, "a")], 0.0))
    assert joiner.owner.live_since is None, "an earlier process of site a was a voter and is gone"


def test_committed_rounds_reach_the_ledger_and_the_events_the_ledger_file(tmp_path: Path) -> None:
    sent: list[tuple[str, object]] = []
    leasing = _leasing(tmp_path, sent)
    leasing.run(leasing.cores.apply_entries(_view_entries("a"), 0.0))
    for t in range(20):  # the client asks its own shard: deliver to self synchronously here
        leasing.run(leasing.cores.tick(float(t) / 10))
        while sent:
            _, msg = sent.pop(0)
            leasing.run(leasing.cores.receive(msg, float(t) / 10))  # type: ignore[arg-type]
    assert leasing.held == 2
    taken = tuple(r for block, sp in leasing.client.next_samples(3, 2.0) for r in to_ranges(block, sp))
    assert sum(r.num_samples for r in taken) == 3
    ledger = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) == 2 and all('"grant"' in line for line in ledger)
    leasing.run(leasing.cores.apply_entries([Entry(5, Epoch(1), RoundCommit(1, (Contributor(SiteId("a"), 1, taken, b""),), b""))], 3.0))
    assert leasing.ledger.committed == 3 and leasing.ledger.last_round == 1


def test_a_voter_without_a_trainer_owns_no_lease_shard(tmp_path: Path) -> None:
    """w votes (a long-lived coordinator) but runs no lease cores: a shard of the blocks it owned
    would never be served, and the joiners that asked it first got no lease until another site let
    one go (a soak: 9 rounds of "no leased sample" per job). The ring views leave it out, from the
    log alone, so every peer and `ops audit` compute the same ones."""
    sent: list[tuple[str, object]] = []
    leasing = _leasing(tmp_path, sent)
    coordinator = Entry(2, Epoch(0), VoterChange(SiteId("w"), "w:1", True, "join", trainerless=True))
    leasing.run(leasing.cores.apply_entries([_change(1, "a"), coordinator], 0.0))
    assert leasing.owner.view is not None and leasing.owner.view.members == ("a",)
    assert leasing.owner.serving == {1, 2}, "a owns every block: w owns none"
    leasing.run(leasing.cores.apply_entries([_change(3, "b")], 0.0))
    assert leasing.owner.view.members == ("a", "b")
    assert leasing.cores.accepted_view(2) is not None and leasing.cores.accepted_view(2).members == ("a",)
