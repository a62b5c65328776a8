"""Prometheus metrics of one peer, read from its cores when scraped.

    peer serve --site a --train micro --metrics-listen 127.0.0.1:9101
    curl -s 127.0.0.1:9101/metrics | grep '^sitemesh_'

The cores already hold almost every number an operator wants (members by state, epoch, commit
index, leases held, the last round's timeline), so a custom Collector reads them at scrape time
instead of counters sprinkled through protocol code. The few things that are events rather than
state (suspicions, refutations, commit latencies, exclusions) are counted in `PeerEvents` (peer_events.py), a plain
object the node and the coordinator update where the event happens.

The HTTP server runs in its own thread (prometheus_client's); every family is built on the node's
event loop, which owns the cores, so a scrape never reads a core mid-update.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from peer.core.commitlog import RoundCommit
from peer.core.lease_types import EventKind
from peer.core.timeline import PHASES
from peer.job_record import JobRecord
from peer.peer_events import EXCLUSION_KINDS

if TYPE_CHECKING:
    from peer.runtime_view import PeerView

log = logging.getLogger("sitemesh.metrics")

SCRAPE_TIMEOUT_S = 5.0
"""How long a scrape waits for the event loop; a loop busier than that is itself worth a failed scrape."""

def _peak_rss_bytes(pid: int | None) -> float | None:
    """VmHWM of a process (Linux): the trainer worker's peak resident memory."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.MULTILINE)
    return float(m.group(1)) * 1024 if m else None


def families(node: PeerView) -> Iterator[Metric]:
    """Every sitemesh metric family of `node`, read now (call on the node's event loop)."""
    ev = node.events
    members = GaugeMetricFamily("sitemesh_members", "Members of the mesh by state, as this peer sees them",
                                labels=["state"])
    states = Counter(v.state.name.lower() for v in node.members())
    for state in ("alive", "suspect", "dead", "left"):
        members.add_metric([state], states.get(state, 0))
    yield members
    yield CounterMetricFamily("sitemesh_membership_suspicions", "Members this peer saw become suspect",
                              value=ev.suspicions)
    yield CounterMetricFamily("sitemesh_membership_refutations",
                              "Suspect members that refuted the suspicion (back to alive)", value=ev.refutations)

    consensus = node.consensus_status()
    yield GaugeMetricFamily("sitemesh_consensus_epoch", "Current leader epoch (term)", value=consensus.epoch)
    leader = GaugeMetricFamily("sitemesh_consensus_leader", "1 for the site this peer believes leads",
                               labels=["site"])
    if consensus.leader:
        leader.add_metric([consensus.leader], 1)
    yield leader
    yield GaugeMetricFamily("sitemesh_consensus_is_leader", "1 when this peer leads the current epoch",
                            value=1 if consensus.role.value == "leader" else 0)
    yield GaugeMetricFamily("sitemesh_consensus_voters", "Voters in this peer's log", value=len(consensus.voters))
    yield GaugeMetricFamily("sitemesh_consensus_commit_index", "Log index of the last committed entry",
                            value=consensus.commit_index)
    yield GaugeMetricFamily("sitemesh_consensus_applied_index", "Log index of the last entry applied here",
                            value=consensus.applied_index)
    latency = HistogramMetricFamily("sitemesh_consensus_commit_latency_seconds",
                                    "Leader: seconds from proposing a round's commit to its commit")
    latency.add_metric([], ev.commit_latency.cumulative(), sum_value=ev.commit_latency.total)
    yield latency
    yield CounterMetricFamily("sitemesh_rounds_committed", "Outer rounds committed in the log",
                              value=consensus.committed_round)
    core = node.consensus_core()
    _, index, _ = core.log.last_round_entry(consensus.commit_index)
    entry = core.log.entry(index) if index else None
    if entry is not None and isinstance(entry.body, RoundCommit):
        yield GaugeMetricFamily("sitemesh_round_contributors", "Contributors of the last committed round",
                                value=len(entry.body.contributors))
    excluded = CounterMetricFamily("sitemesh_rounds_excluded",
                                   "Contributions this peer, as leader, left out of a round", labels=["reason"])
    for kind in EXCLUSION_KINDS:
        excluded.add_metric([kind], ev.excluded.get(kind, 0))
    yield excluded
    refused = CounterMetricFamily("sitemesh_refused_implausible",
                                  "Membership and consensus messages refused as no honest peer sends them "
                                  "(forged or buggy)", labels=["layer", "site", "message"])
    for (layer, site, message), n in sorted(node.events.refused.items()):
        refused.add_metric([layer, site, message], n)
    yield refused

    coord = node.coordinator
    if coord is None:
        return
    yield from _training_families(node)


def _training_families(node: PeerView) -> Iterator[Metric]:
    coord = node.coordinator
    assert coord is not None
    training = coord.training
    yield GaugeMetricFamily("sitemesh_round_applied", "Last round whose θ this peer holds",
                            value=training.applied_round)
    last = coord.last_timeline
    phase = GaugeMetricFamily("sitemesh_round_last_phase_seconds", "Seconds of this site's last round, by phase",
                              labels=["phase"])
    phase_total = CounterMetricFamily("sitemesh_round_phase_seconds",
                                      "Seconds of this site's rounds since start, by phase", labels=["phase"])
    totals = coord.clock.totals
    for p in PHASES:
        if last is not None:
            phase.add_metric([p], getattr(last, f"{p}_s"))
        phase_total.add_metric([p], totals.get(p, 0.0))
    yield phase
    yield phase_total
    if last is not None:
        yield GaugeMetricFamily("sitemesh_round_last_wall_seconds", "Wall seconds of this site's last round",
                                value=last.wall_s)
        yield GaugeMetricFamily("sitemesh_round_last_overhead_ratio",
                                "1 - compute / wall of this site's last round", value=last.overhead_share)
    yield CounterMetricFamily("sitemesh_trainer_tokens", "Tokens this site trained since start",
                              value=totals.get("tokens", 0.0))
    if last is not None and last.compute_s > 0:
        yield GaugeMetricFamily("sitemesh_trainer_tokens_per_second",
                                "Tokens per second of inner compute in this site's last trained round",
                                value=last.tokens / last.compute_s)
    if not math.isnan(training.last_loss):
        yield GaugeMetricFamily("sitemesh_trainer_loss", "Mean inner loss of this site's last round",
                                value=training.last_loss)
    evaluated = coord.heldout.last
    if evaluated is not None and evaluated.heldout_perplexity is not None:  # this peer evaluated θ (peer/heldout.py)
        yield GaugeMetricFamily("sitemesh_heldout_perplexity", "Held-out perplexity of θ of the round in "
                                "sitemesh_heldout_round, the last one this peer evaluated",
                                value=evaluated.heldout_perplexity)
        yield GaugeMetricFamily("sitemesh_heldout_round", "The round whose θ sitemesh_heldout_perplexity measured",
                                value=evaluated.round)
        yield GaugeMetricFamily("sitemesh_heldout_tokens", "Tokens the run had committed through that round",
                                value=evaluated.committed_tokens or 0)
    yield from _job_families(coord.job.record)
    peak = _peak_rss_bytes(training.process.pid)
    if peak is not None:
        yield GaugeMetricFamily("sitemesh_trainer_peak_memory_bytes",
                                "Peak resident memory of the trainer worker process", value=peak)

    received = CounterMetricFamily("sitemesh_exchange_received_bytes",
                                   "Pseudo-gradient bytes pulled from each peer", labels=["peer"])
    mismatches = CounterMetricFamily("sitemesh_exchange_hash_mismatches",
                                     "Chunks from each peer whose blake3 did not match (re-fetched)", labels=["peer"])
    refetches = CounterMetricFamily("sitemesh_exchange_refetches",
                                    "Chunk streams from each peer restarted after a fault (stall, transport "
                                    "error, truncated stream, corrupt or misplaced chunk)", labels=["peer"])
    for site, s in sorted(training.exchange.fetched.items()):
        received.add_metric([site], s.bytes)
        mismatches.add_metric([site], s.corrupt_chunks)
        refetches.add_metric([site], s.corrupt_chunks + s.misplaced_chunks + s.truncated_streams + s.stalls
                             + s.transport_errors)
    yield received
    sent = CounterMetricFamily("sitemesh_exchange_sent_bytes",
                               "Chunk bytes this peer's exchange service streamed to other peers, by object kind "
                               "(pseudo_gradient, mean_shard, global_state)", labels=["kind"])
    for kind, n in sorted(training.exchange.store.sent_bytes.items()):
        sent.add_metric([kind], n)
    yield sent
    yield mismatches
    yield refetches
    refused = CounterMetricFamily("sitemesh_exchange_bulk_refused",
                                  "Bulk data-plane connections this peer refused, by status (INVALID_ARGUMENT: "
                                  "not a bulk request; UNAUTHENTICATED: unknown, used or expired token; "
                                  "RESOURCE_EXHAUSTED: too many connections)", labels=["status"])
    for status, n in sorted(training.exchange.bulk_refusals().items()):
        refused.add_metric([status], n)
    yield refused

    leasing = coord.leasing
    if leasing is None:
        return
    yield GaugeMetricFamily("sitemesh_leases_held", "Data leases this site holds (started or prefetched)",
                            value=leasing.held)
    events = CounterMetricFamily("sitemesh_lease_events", "Lease events this site logged as a block's owner",
                                 labels=["kind"])
    for kind in sorted(k.value for k in EventKind):  # every kind, 0 included: rate() needs the series
        events.add_metric([kind], leasing.event_counts.get(kind, 0))
    yield events
    yield CounterMetricFamily("sitemesh_samples_committed", "Samples committed over the run",
                              value=coord.samples_committed)
    yield GaugeMetricFamily("sitemesh_samples", "Samples the run trains (every sample once per data epoch)",
                            value=coord.samples_total)
    yield GaugeMetricFamily("sitemesh_data_epoch", "The data epoch the log is in", value=leasing.ledger.data_epoch)


def _job_families(job: JobRecord) -> Iterator[Metric]:
    """This job's accounting (peer/job_record.py) as timestamps and seconds, so that PromQL derives
    the rest: allocated = time() - start, goodput = inner / allocated (ops/accounting.py)."""
    yield GaugeMetricFamily("sitemesh_job_start_timestamp_seconds", "When this job's allocation began (Unix time)",
                            value=job.job_start)
    if job.job_end is not None:
        yield GaugeMetricFamily("sitemesh_job_end_timestamp_seconds",
                                "When Slurm ends this job's allocation (Unix time)", value=job.job_end)
    yield GaugeMetricFamily("sitemesh_job_nodes", "Nodes of this job's allocation", value=job.nodes)
    yield CounterMetricFamily("sitemesh_job_inner_seconds", "Seconds this job's trainer spent in inner steps",
                              value=job.inner_s)
    if job.first_step is not None:
        yield GaugeMetricFamily("sitemesh_job_joining_seconds",
                                "Seconds from this job's start to its first inner step (its fixed start cost)",
                                value=job.joining_s)


class PeerCollector(Collector):
    """Builds the families on the node's loop; `collect` runs in the HTTP server's thread."""

    def __init__(self, node: PeerView, loop: asyncio.AbstractEventLoop) -> None:
        self._node = node
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        async def on_loop() -> list[Metric]:
            return list(families(self._node))

        future = asyncio.run_coroutine_threadsafe(on_loop(), self._loop)
        yield from future.result(timeout=SCRAPE_TIMEOUT_S)


def serve(node: PeerView, listen: str) -> int:
    """Starts the /metrics endpoint on `listen` (host:port, port 0 picks one); returns the bound port.
    Call from the node's event loop."""
    from peer.config import parse_address

    host, port = parse_address(listen, "metrics address")
    registry = CollectorRegistry()
    registry.register(PeerCollector(node, asyncio.get_running_loop()))
    server, _ = start_http_server(port, host.strip("[]"), registry=registry)
    bound = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound
