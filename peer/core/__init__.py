"""Pure cores above the protocol cores: the site's half of an outer round, sans I/O.

`RoundCore` (peer/core/round_core.py) composes three state machines, each `handle(event, now) ->
effects` plus `next_deadline()`, that never await, sleep or touch grpc, torch or the disk:

- `SiteRound` (site_round.py): gather leased samples, ask the trainer to train them, claim them from
  their owners, report to the leader; answer a reopened round; a graceful leave (I8).
- `Decision` (decision.py): the leader's fetch of a decided round's pseudo-gradients, dropping a
  contributor whose Δ cannot be fetched or that membership declared dead, then the proposal.
- `ApplyQueue` (apply.py): committed rounds applied strictly in log order, retried with back-off,
  replaced by a state transfer when this peer's θ disagrees with the log (I7) or fell behind.

Their events and effects are in events.py. The executor (peer/coordinator.py) runs the effects
(trainer calls, the exchange, disk, lease and round sends) and feeds the completions back as events;
the simulator (peer/sim/peer_sim.py) runs the same cores with a fake trainer in simulated time.
Every decision is returned as a `Note` with its reason and kept in `RoundCore.reasons`.

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py
"""
