"""Discrete-event loop driving many protocol cores over a fake network with fake clocks.

FoundationDB-style deterministic simulation: one seeded event heap (message deliveries, node
timers, scheduled fault actions), every node a sans-I/O core, invariants checked after every event,
and the first violation stops the run so the seed can be replayed with a trace.

A node is anything with the three methods of `Node` (the membership core, an election core, a lease
table core ...). Effects a node returns that have `.to` (an address) and `.msg` are sent over the
`SimNetwork`; every effect, sent or not, is shown to the `Checker` together with the node that
produced it. See `peer.sim` for how to plug a new protocol in.

    ops simulate --members 20 --seeds 0:50 --faults all
"""

from __future__ import annotations

import enum
import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from peer.sim.clock import NodeClock
from peer.sim.network import SimNetwork


class Node(Protocol):
    """The sans-I/O core interface the simulator drives (times are the node's local clock)."""

    def tick(self, now: float) -> list[Any]: ...

    def receive(self, msg: Any, now: float) -> list[Any]: ...

    def next_deadline(self) -> float: ...


# local now -> (a fresh node, the effects of starting it, e.g. a join)
NodeFactory = Callable[[float], "tuple[Node, list[Any]]"]


class Checker(Protocol):
    """Protocol-specific invariants. `after_event` runs after every event (address is "" for a
    scheduled action) and returns violations (empty: fine); `at_end` runs once when time is up."""

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]: ...

    def at_end(self, sim: Simulation) -> list[str]: ...


class NodeState(enum.Enum):
    DOWN = "down"  # not started yet, or crashed
    UP = "up"
    PAUSED = "paused"  # stopped (SIGSTOP, a long GC): keeps its state, messages wait for it


@dataclass
class RunResult:
    seed: int
    events: int
    end_time: float
    violations: list[str]
    stats: dict[str, int] = field(default_factory=dict)


# Event kinds in the heap; ties in time keep scheduling order (the sequence number).
_DELIVER, _TIMER, _ACTION = 0, 1, 2
# Events one node may handle at one instant before we call it a livelock (a core that keeps
# asking to be ticked now without making progress).
_MAX_SAME_INSTANT = 10_000


class Simulation:
    """Nodes, their clocks, the network and the event heap of one seeded run."""

    def __init__(self, seed: int, network: SimNetwork,
                 trace: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.network = network
        self.now = 0.0
        self.events = 0
        self._trace = trace
        self._heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self._factories: dict[str, NodeFactory] = {}
        self._nodes: dict[str, Node] = {}
        self._state: dict[str, NodeState] = {}
        self._clocks: dict[str, NodeClock] = {}
        self._gen: dict[str, int] = defaultdict(int)  # timer generation: older timer events are void
        self._timer_at: dict[str, float] = {}
        self._held: dict[str, list[Any]] = defaultdict(list)
        self._busy: tuple[float, str, int] = (-1.0, "", 0)
        self._stopped = False
        # The message whose delivery is the current event (None for ticks and actions): checkers
        # may look at what a node was told, e.g. to know a rumour reached it.
        self.delivering: Any = None

    # -- set-up and fault actions ------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return sorted(self._factories)

    def add_node(self, address: str, factory: NodeFactory, at: float = 0.0,
                 clock: NodeClock | None = None) -> None:
        """Register a node; it is created (factory called) at true time `at`."""
        if address in self._factories:
            raise ValueError(f"duplicate address {address}")
        self._factories[address] = factory
        self._clocks[address] = clock or NodeClock()
        self._state[address] = NodeState.DOWN
        self.schedule(at, lambda: self.restart(address), f"start {address}")

    def schedule(self, at: float, action: Callable[[], None], label: str) -> None:
        """Run `action` at true time `at` (a fault, a scenario step, a timed invariant check)."""
        self._push(at, _ACTION, label, action)

    def node(self, address: str) -> Node | None:
        """The running (or paused) node at `address`, None when down."""
        return self._nodes.get(address)

    def state(self, address: str) -> NodeState:
        return self._state[address]

    def local_now(self, address: str) -> float:
        return self._clocks[address].local(self.now)

    def clock(self, address: str) -> NodeClock:
        return self._clocks[address]

    def restart(self, address: str) -> None:
        """(Re)start the node at `address` from scratch: a new process with no memory."""
        node, effects = self._factories[address](self.local_now(address))
        self._nodes[address] = node
        self._state[address] = NodeState.UP
        self._held.pop(address, None)
        self._after(address, effects)

    def crash(self, address: str) -> None:
        self._nodes.pop(address, None)
        self._state[address] = NodeState.DOWN
        self._held.pop(address, None)
        self._cancel_timer(address)

    def pause(self, address: str) -> None:
        if self._state[address] is NodeState.UP:
            self._state[address] = NodeState.PAUSED
            self._cancel_timer(address)

    def resume(self, address: str) -> None:
        """Wake a paused node: the messages that waited are delivered first, then its timers run."""
        if self._state[address] is not NodeState.PAUSED:
            return
        self._state[address] = NodeState.UP
        for msg in self._held.pop(address, []):
            self._push(self.now, _DELIVER, address, msg)
        self._reschedule(address)

    def act(self, address: str, action: Callable[[Any, float], list[Any]]) -> None:
        """Call `action(node, local_now)` on a running node (e.g. a graceful leave) and carry out
        the effects it returns."""
        if self._state[address] is NodeState.UP:
            self._after(address, action(self._nodes[address], self.local_now(address)))

    def stop(self) -> None:
        """End the run after the current event (a scenario that has seen enough)."""
        self._stopped = True

    def jump_clock(self, address: str, seconds: float) -> None:
        self._clocks[address].jump(seconds)
        if self._state[address] is NodeState.UP:
            self._cancel_timer(address)
            self._reschedule(address)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, until: float, checker: Checker) -> RunResult:
        """Process events up to true time `until`, checking invariants after each one."""
        violations: list[str] = []
        while self._heap and not violations and not self._stopped:
            t, _, kind, a, b = self._heap[0]
            if t > until:
                break
            heapq.heappop(self._heap)
            self.now = t
            self.delivering = None
            if kind == _ACTION:
                self._log("", f"action {a}")
                b()
                address, effects = "", []
            elif kind == _TIMER:
                if b != self._gen[a] or self._state[a] is not NodeState.UP:
                    continue  # superseded or cancelled
                address = a
                self._timer_at.pop(a, None)
                effects = self._nodes[a].tick(self.local_now(a))
                self._log(a, "tick", effects)
            else:
                address = a
                state = self._state.get(a)
                if state is None or state is NodeState.DOWN:
                    self.network.stats["lost_node_down"] += 1
                    continue
                if state is NodeState.PAUSED:
                    self._held[a].append(b)
                    continue
                self._log(a, f"recv {_short(b)}")
                self.delivering = b
                effects = self._nodes[a].receive(b, self.local_now(a))
                self._log(a, "->", effects)
            self.events += 1
            if address:
                violations += self._livelock(address)
                self._after(address, effects)
            violations += checker.after_event(self, address, effects)
        if not violations:
            if not self._stopped:
                self.now = max(self.now, until)
            violations = checker.at_end(self)
        for v in violations:
            self._log("", f"VIOLATION {v}")
        return RunResult(self.seed, self.events, self.now, violations, dict(self.network.stats))

    # -- internals ---------------------------------------------------------------------------------

    def _after(self, address: str, effects: Sequence[Any]) -> None:
        for e in effects:
            to = getattr(e, "to", None)
            if to is not None and hasattr(e, "msg"):
                if to not in self._state:
                    self.network.stats["lost_no_such_address"] += 1
                    continue
                for at in self.network.send(address, to, self.now):
                    self._push(at, _DELIVER, to, e.msg)
        if self._state.get(address) is NodeState.UP:
            self._reschedule(address)

    def _reschedule(self, address: str) -> None:
        local = self._nodes[address].next_deadline()
        if local == float("inf"):
            self._cancel_timer(address)
            return
        at = max(self.now, self._clocks[address].to_true(local))
        if self._timer_at.get(address) == at:
            return
        self._gen[address] += 1
        self._timer_at[address] = at
        self._push(at, _TIMER, address, self._gen[address])

    def _cancel_timer(self, address: str) -> None:
        self._gen[address] += 1
        self._timer_at.pop(address, None)

    def _push(self, at: float, kind: int, a: Any, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, a, b))

    def _livelock(self, address: str) -> list[str]:
        t, who, count = self._busy
        count = count + 1 if (t, who) == (self.now, address) else 1
        self._busy = (self.now, address, count)
        if count > _MAX_SAME_INSTANT:
            return [f"livelock: {address} handled {count} events at t={self.now:.6f}"]
        return []

    def _log(self, address: str, what: str, effects: Sequence[Any] = ()) -> None:
        if self._trace is None:
            return
        if what == "->" or what == "tick":
            sends = [f"{_short(e.msg)}>{e.to}" for e in effects if hasattr(e, "msg")]
            other = [repr(e) for e in effects if not hasattr(e, "msg")]
            if not sends and not other:
                return
            what = f"{what} " + " ".join(sends + other)
        self._trace(f"{self.now:11.4f} {address:>14} {what}")


def _short(msg: Any) -> str:
    """One-word summary of a message for traces: its type and seq when it has one."""
    seq = getattr(msg, "seq", None)
    return type(msg).__name__ + (f"#{seq}" if seq is not None else "")


def derive_rng(seed: int, purpose: str) -> random.Random:
    """An independent, reproducible random stream per purpose (network, faults, node names ...),
    so adding a draw in one place does not reshuffle every other decision of the seed."""
    return random.Random(f"{seed}:{purpose}")
