"""Thin servicer for `sitemesh.v1.Admin`: status, graceful leave and join, for `ops` and grpcurl."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from peer.config import ConfigError, check_peer_address
from peer.reach import Reach
from peer.transport.route import BadRoute
from peer.join_errors import JoinFailed
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc, common_pb2, membership_pb2
from peer.core.membership_types import LIVE
from peer.core.timeline import PHASES, RoundTimeline
from peer.job_record import JobRecord
from peer.transport.wire import to_proto

if TYPE_CHECKING:
    from peer.runtime_view import PeerView


def timeline_to_proto(rec: RoundTimeline) -> admin_pb2.RoundTimeline:
    return admin_pb2.RoundTimeline(
        round=rec.round, wall_s=rec.wall_s, overhead_share=rec.overhead_share, tokens=rec.tokens,
        tokens_per_s=rec.tokens_per_s, inner_steps=rec.inner_steps,
        **{f"{p}_s": getattr(rec, f"{p}_s") for p in PHASES})


def job_to_proto(job: JobRecord) -> admin_pb2.JobStatus:
    """A job's seconds so far (`job`: its record as of now, JobLog.live)."""
    out = admin_pb2.JobStatus(job=job.job, member=job.member, nodes=job.nodes, allocated_s=job.allocated_s,
                              joining_s=job.joining_s, training_s=job.inner_s,
                              goodput=job.inner_s / job.allocated_s if job.allocated_s > 0 else 0.0)
    if job.job_end is not None:
        out.ends_in_s = max(job.job_end - job.updated, 0.0)
    return out


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, node: PeerView) -> None:
        self._node = node

    async def Status(self, request, context):  # noqa: N802 - generated name
        now = self._node.now()
        consensus = self._node.consensus_status()
        reply = admin_pb2.StatusReply(
            self=self._node.config.site,
            uptime_s=self._node.uptime_s(),
            version=self._node.version,
            consensus=admin_pb2.ConsensusStatus(
                role=consensus.role.value.replace("-", "_"),
                epoch=consensus.epoch,
                leader=consensus.leader or "",
                lease_remaining_s=max(consensus.lease_expiry - now, 0.0) if consensus.lease_expiry is not None else 0.0,
                committed_round=consensus.committed_round,
                commit_index=consensus.commit_index,
                applied_index=consensus.applied_index,
                voters=[site for site, _ in consensus.voters],
            ),
        )
        coord = self._node.coordinator
        if coord is not None:
            reply.training.CopyFrom(admin_pb2.TrainingStatus(
                applied_round=coord.training.applied_round,
                weights_hash=coord.training.weights_hash.hex(),
                samples_committed=coord.samples_committed,
                samples_total=coord.samples_total,
                last_loss=coord.training.last_loss,
                epoch_complete=coord.epoch_complete,
                diverged=coord.diverged,
                data_epoch=coord.leasing.ledger.data_epoch if coord.leasing else 0,
                leases_held=coord.leasing.held if coord.leasing else 0,
                last_decision=coord.last_reason,
            ))
            if coord.last_timeline is not None:
                reply.training.last_round.CopyFrom(timeline_to_proto(coord.last_timeline))
            reply.training.job.CopyFrom(job_to_proto(coord.job.live()))
        reach = self._node.reach
        for view in self._node.members():
            me = view.site == self._node.config.site
            reply.members.append(
                admin_pb2.MemberStatus(
                    site=view.site,
                    address=view.address,
                    state=membership_pb2.MemberState.Value(f"MEMBER_STATE_{view.state.name}"),
                    incarnation=view.incarnation,
                    last_heard_s=0.0 if me else max(now - view.last_heard, 0.0),
                    meta=to_proto(view.meta, common_pb2.MemberMeta) if view.meta else None,
                    rtt_s=view.rtt_s,
                    path=reach.describe() if me else _path(reach, view.address),
                )
            )
        return reply

    async def Leave(self, request, context):  # noqa: N802
        # The reply must go out before the server stops, so the leave runs after we return.
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._node.leave()))
        live = sum(1 for v in self._node.members() if v.state in LIVE)
        return admin_pb2.LeaveReply(notified=max(live - 1, 0))

    async def Join(self, request, context):  # noqa: N802
        if not request.seeds:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "JoinRequest.seeds is empty: give host:port of a member")
        try:
            for seed in request.seeds:
                check_peer_address(seed, "seed address")
            members = await self._node.join(request.seeds)
        except ConfigError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except JoinFailed as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return admin_pb2.JoinReply(members=members)

    async def DialBack(self, request, context):  # noqa: N802
        try:
            check_peer_address(request.address, "address to dial back")
        except ConfigError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return await self._node.reach.dial_back(request.address, request.from_site)


def _path(reach: Reach, address: str) -> str:
    """How this peer dials `address`; an address no route can be read from says so."""
    try:
        return reach.dialer.path(address)
    except BadRoute as err:
        return f"unknown ({err})"
