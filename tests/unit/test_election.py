"""The election rules on their own: vote decisions, majorities, the lease margin, config presets."""

from __future__ import annotations

import pytest

from peer.core.election import (
    ElectionConfig,
    Epoch,
    HardState,
    Header,
    RequestVote,
    SiteId,
    has_majority,
    majority,
    vote_decision,
)


def _req(epoch: int, last_index: int, last_epoch: int, pre_vote: bool = False, cand: str = "b") -> RequestVote:
    proposed = epoch + 1 if pre_vote else epoch
    return RequestVote(Header(SiteId(cand), f"{cand}:1", Epoch(epoch), 0), Epoch(proposed), last_index,
                       Epoch(last_epoch), pre_vote)


# (hard state, request, own last (index, epoch), sticky, granted, reason fragment)
VOTE_CASES = [
    (HardState(Epoch(3), None), _req(4, 10, 3), (10, 3), None, True, "granted"),
    (HardState(Epoch(3), None), _req(2, 10, 3), (10, 3), None, False, "stale epoch 2 < 3"),
    (HardState(Epoch(4), SiteId("c")), _req(4, 10, 3), (10, 3), None, False, "already voted for c in epoch 4"),
    (HardState(Epoch(4), SiteId("b")), _req(4, 10, 3), (10, 3), None, True, "granted"),  # idempotent re-ask
    (HardState(Epoch(3), None), _req(4, 9, 3), (10, 3), None, False, "candidate log is behind"),
    (HardState(Epoch(3), None), _req(4, 5, 3), (10, 2), None, True, "granted"),  # higher last epoch wins
    (HardState(Epoch(3), None), _req(4, 20, 2), (10, 3), None, False, "candidate log is behind"),
    (HardState(Epoch(3), None), _req(4, 10, 3), (10, 3), "leader a heard", False, "leader a heard"),
    (HardState(Epoch(3), None), _req(3, 10, 3, pre_vote=True), (10, 3), None, True, "granted"),
    (HardState(Epoch(3), SiteId("c")), _req(3, 10, 3, pre_vote=True), (10, 3), None, True, "granted"),
    (HardState(Epoch(5), None), _req(3, 10, 3, pre_vote=True), (10, 3), None, False, "pre-vote for epoch 4 <= current"),
    (HardState(Epoch(3), None), _req(3, 10, 3, pre_vote=True), (10, 3), "restarted", False, "restarted"),
]


@pytest.mark.parametrize("hard,req,own,sticky,granted,reason", VOTE_CASES)
def test_vote_decision(hard: HardState, req: RequestVote, own: tuple[int, int], sticky: str | None,
                       granted: bool, reason: str) -> None:
    ok, why = vote_decision(hard, req, own, sticky)
    assert ok is granted
    assert reason in why


@pytest.mark.parametrize("n,need", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (9, 5), (51, 26)])
def test_majority(n: int, need: int) -> None:
    assert majority(SiteId(f"s{i}") for i in range(n)) == need


def test_only_configured_voters_count_toward_a_majority() -> None:
    voters = [SiteId(s) for s in "abc"]
    assert has_majority({SiteId("a"), SiteId("b")}, voters)
    # Observers or gossip-known peers outside the voter set do not make a majority.
    assert not has_majority({SiteId("a"), SiteId("x"), SiteId("y")}, voters)
    assert not has_majority({SiteId("a")}, [])


def test_lease_fits_inside_every_voters_refusal_window() -> None:
    cfg = ElectionConfig(election_timeout_min_s=1.0, election_timeout_max_s=2.0, heartbeat_interval_s=0.1,
                         max_clock_drift=0.05)
    # Real duration of the lease on a leader whose clock runs slow by the full drift ...
    leader_real = cfg.lease_s / (1 - cfg.max_clock_drift)
    # ... never exceeds the real duration of a voter's refusal window on a clock that runs fast.
    voter_real = cfg.election_timeout_min_s / (1 + cfg.max_clock_drift)
    assert leader_real <= voter_real + 1e-12
    assert cfg.lease_s > 0.9 * cfg.election_timeout_min_s


@pytest.mark.parametrize("preset", [ElectionConfig.wan, ElectionConfig.lan, ElectionConfig.local_test])
def test_presets_are_valid_and_renew_the_lease_several_times(preset: object) -> None:
    cfg = preset()  # type: ignore[operator]
    assert cfg.lease_s / cfg.heartbeat_interval_s >= 5


@pytest.mark.parametrize("kwargs", [
    dict(election_timeout_min_s=1.0, election_timeout_max_s=1.0, heartbeat_interval_s=0.1, max_clock_drift=0.01),
    dict(election_timeout_min_s=1.0, election_timeout_max_s=2.0, heartbeat_interval_s=1.0, max_clock_drift=0.01),
    dict(election_timeout_min_s=1.0, election_timeout_max_s=2.0, heartbeat_interval_s=0.1, max_clock_drift=0.6),
])
def test_config_rejects_unsafe_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ElectionConfig(**kwargs)  # type: ignore[arg-type]
