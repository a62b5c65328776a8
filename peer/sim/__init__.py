"""Deterministic simulation of sans-I/O protocol cores (FoundationDB-style), seeded and replayable.

    ops simulate --members 20 --seeds 0:500 --faults all --jobs 2
    ops simulate --members 20 --seed 137 --faults all --trace      # replay one seed, every event

Modules, generic first:

- `clock`    NodeClock: a node's local time (offset, drift, forward jumps) over one true timeline.
- `network`  SimNetwork: seeded fates of messages between addresses (latency, drop, duplicate,
             reorder, extra delay, symmetric / one-way / bridge partitions) and loss accounting.
- `faults`   seeded fault schedules (`plan`) over a window, named sets (`--faults all`), `apply`.
- `runner`   Simulation: the event heap (deliveries, node timers, scheduled actions), crash /
             restart / pause / resume / clock jumps of nodes, invariant checks after every event.
- `membership_sim`  the membership scenario and its invariants (an example to copy).
- whole peers: the real round, consensus and lease cores with a fake trainer and θ, in layers
  (each imports only modules earlier in this list):
  - `peer_config`  timings, bounds and PeerSimConfig.
  - `faulty`       a site of the run that sends protocol-valid but false messages to the peers
                   (it sees peers and world through small Protocols of its own).
  - `peer_node`    PeerNode: one site's cores and the executor of their effects (fake trainer,
                   exchange, disk); `Host` is what it asks of the world.
  - `peer_world`   World: membership's verdicts, the disks, the committed truth, the invariants.
  - `peer_faults`  FaultSchedule: the seed's kills, pauses, cuts, leaves and restarts.
  - `peer_sim`     PeerSim (a World that runs) and `ops simulate --protocol peer`'s entry points.

Plugging in a new protocol core (election/commit log, lease table ...):

1. The core implements `runner.Node`: `tick(now)`, `receive(msg, now)`, `next_deadline()`, all in
   the node's local clock; they return effects. An effect with `.to` (an address) and `.msg` is
   sent over the simulated network (any frozen dataclass `Send(to, msg)` works); other effects
   (state changes, commits, decisions) are only shown to the checker.
2. Write a `Checker` (`runner.Checker`): `after_event(sim, address, effects) -> list[str]` runs
   after every event (address "" for scheduled actions such as faults) and returns violations;
   `at_end(sim)` runs once. Safety invariants inspect the effects of the node that just acted
   (cheap); timed properties ("within a bound") schedule their own check with `sim.schedule`.
   `sim.node(address)` gives the live core object (None when crashed), `sim.state(address)` its
   process state, `sim.delivering` the message whose delivery is the current event (None for ticks
   and actions), `sim.act(address, fn)` lets a scenario call the core (a leave, a proposal) and
   sends what it returns, `sim.stop()` ends a run that has shown enough.
3. Write `run_seed(seed, scenario, trace) -> RunResult`: build a `SimNetwork` and a `Simulation`
   with `runner.derive_rng(seed, purpose)` streams, `sim.add_node(address, factory, at, clock)`
   where `factory(local_now) -> (core, initial_effects)` builds a fresh process (called again on
   every restart: a restarted process has no memory unless the factory gives it its disk), plan
   and `faults.apply` a schedule, then `sim.run(until, checker)`.
4. Register it in `ops/simulate.py` (`PROTOCOLS["consensus"] = SimProtocol(run, replay_flags)`), so
   `ops simulate --protocol consensus` sweeps seeds and prints replay commands for failures.
5. Prove the checker bites: run it against a deliberately broken core in a test
   (see `tests/sim/test_membership_sim.py::test_broken_cores_are_caught`).
"""
