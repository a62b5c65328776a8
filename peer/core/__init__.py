"""Every pure core of a peer, sans I/O: time and messages in, effects out.

The import contract in pyproject.toml (run by scripts/test.sh) keeps this package free of grpc,
torch, asyncio, transformers and every edge (peer.node, peer.coordinator, peer.transport, ...):

- membership (SWIM + Lifeguard): membership.py, suspicion.py, broadcast.py, awareness.py,
  membership_types.py, membership_config.py;
- consensus (leader by lease epoch, the round-commit log): election.py, consensus.py, commitlog.py;
- data leases (DARL): ring.py, leases.py (owner), lease_client.py (holder), lease_types.py,
  lease_log.py (both fed from the log), admission.py (I6), audit.py (the ledger, I4/I5);
- rounds: rounds.py (the leader's half), and the site's half below; samples.py, ids.py,
  timeline.py (the per-round record).

The edges around them: peer/node.py and peer/coordinator.py (the effect executors), peer/transport/
(gRPC), peer/exchange/ (the pseudo-gradient data plane), peer/trainer/ (torch), peer/logstore.py and
peer/durable.py (disk); peer/sim/ drives these same cores in simulated time.

The site's half of an outer round:

`RoundCore` (peer/core/round_core.py) composes three state machines, each `handle(event, now) ->
effects` plus `next_deadline()`, that never await, sleep or touch grpc, torch or the disk:

- `SiteRound` (site_round.py): gather leased samples, ask the trainer to train them, claim them from
  their owners, report to the leader; answer a reopened round; a graceful leave (I8).
- `Decision` (decision.py): the leader's fetch of a decided round's pseudo-gradients, dropping a
  contributor whose Δ cannot be fetched or that membership declared dead, then the proposal.
- `ApplyQueue` (apply.py): committed rounds applied strictly in log order, retried with back-off,
  replaced by a state transfer when this peer's θ disagrees with the log (I7) or fell behind.

Their events and effects are in events.py. A peer's whole protocol (these, the lease cores, the
round leader, consensus and a leave's seat) is routed by `PeerCore` (peer_core.py); the node
(peer/node.py, peer/coordinator.py) runs its effects (trainer calls, the exchange, disk, lease and
round sends) and feeds the completions back as events; the simulator (peer/sim/peer_node.py) runs
the same `PeerCore` with a fake trainer in simulated time.
Every decision is returned as a `Note` with its reason and kept in `RoundCore.reasons`.

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py
"""
