"""The access rules (peer/transport/auth.py) over certificates made by ops/certs.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ops.certs import CertError, init_ca, issue
from peer.dirlock import DirLocked, lock_dir
from peer.gen.sitemesh.v1 import admin_pb2, consensus_pb2, exchange_pb2, leases_pb2, membership_pb2, rounds_pb2
from peer.transport.auth import Identity, Role, authorize, identity_of, run_id_of

RUN = "r-000000000000"


def test_certificates_carry_role_name_and_run(tmp_path: Path) -> None:
    run_id = init_ca("c4", tmp_path)
    issued = issue(tmp_path, "lumi", "site", tmp_path, ("lumi-uan01:7001", "10.0.0.1"))
    assert run_id == run_id_of((tmp_path / "ca.crt").read_bytes()) and run_id.startswith("c4-")
    assert identity_of(issued.cert.read_bytes()) == Identity(Role.SITE, "lumi", run_id)
    assert stat.S_IMODE(os.stat(issued.key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    with pytest.raises(CertError, match="already has a run CA"):
        init_ca("c4", tmp_path)
    with pytest.raises(CertError, match="run `ops certs init` first"):
        issue(tmp_path / "nowhere", "x", "site", tmp_path)


SITE, OP, READER = (Identity(Role.SITE, "a", RUN), Identity(Role.OPERATOR, "alice", RUN),
                    Identity(Role.READER, "bob", RUN))
RELAY = Identity(Role.RELAY, "r1", RUN)


@pytest.mark.parametrize(("who", "method", "allowed"), [
    (READER, "/sitemesh.v1.Admin/Status", True),
    (READER, "/grpc.health.v1.Health/Check", True),
    (READER, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", True),
    (READER, "/sitemesh.v1.Admin/Leave", False),
    (SITE, "/sitemesh.v1.Admin/Join", False),
    (OP, "/sitemesh.v1.Admin/Leave", True),
    (OP, "/sitemesh.v1.Membership/SendPing", False),
    (READER, "/sitemesh.v1.Exchange/FetchChunks", False),
    (SITE, "/sitemesh.v1.Exchange/FetchChunks", True),
    (READER, "/sitemesh.v1.Exchange/OpenBulk", False),  # a bulk ticket reads what FetchChunks reads
    (SITE, "/sitemesh.v1.Exchange/OpenBulk", True),
    (SITE, "/sitemesh.v1.Unknown/Thing", False),
    (SITE, "/sitemesh.v1.Admin/DialBack", True),
    (OP, "/sitemesh.v1.Admin/DialBack", False),
    # A relay forwards sites' connections; it can read status and nothing a site may say.
    (RELAY, "/sitemesh.v1.Admin/Status", True),
    (RELAY, "/sitemesh.v1.Membership/SendPing", False),
    (RELAY, "/sitemesh.v1.Exchange/FetchChunks", False),
    (RELAY, "/sitemesh.v1.Admin/DialBack", False),
    (RELAY, "/sitemesh.v1.Admin/Leave", False),
])
def test_roles(who: Identity, method: str, allowed: bool) -> None:
    assert (authorize(who, RUN, method, None) is None) == allowed


@pytest.mark.parametrize(("method", "own", "forged"), [
    ("/sitemesh.v1.Membership/SendPing", membership_pb2.Ping(from_site="a"), membership_pb2.Ping(from_site="b")),
    ("/sitemesh.v1.Consensus/SendAppendEntries",
     consensus_pb2.AppendEntries(header=consensus_pb2.ConsensusHeader(from_site="a")),
     consensus_pb2.AppendEntries(header=consensus_pb2.ConsensusHeader(from_site="b"))),
    ("/sitemesh.v1.Rounds/SendContribution",
     rounds_pb2.Contribution(header=consensus_pb2.ConsensusHeader(from_site="a"), site="a"),
     rounds_pb2.Contribution(header=consensus_pb2.ConsensusHeader(from_site="a"), site="b")),
    ("/sitemesh.v1.Leases/SendRelease", leases_pb2.Release(header=leases_pb2.LeaseHeader(site="a")),
     leases_pb2.Release(header=leases_pb2.LeaseHeader(site="b"))),
    ("/sitemesh.v1.Exchange/Announce", exchange_pb2.Manifest(key=exchange_pb2.ObjectKey(site="a")),
     exchange_pb2.Manifest(key=exchange_pb2.ObjectKey(site="b"))),
    ("/sitemesh.v1.Admin/DialBack", admin_pb2.DialBackRequest(from_site="a"), admin_pb2.DialBackRequest(from_site="b")),
])
def test_a_site_speaks_only_for_itself(method: str, own: object, forged: object) -> None:
    assert authorize(SITE, RUN, method, own) is None
    reason = authorize(SITE, RUN, method, forged)
    assert reason is not None and "site a sent" in reason and "as 'b'" in reason


def test_a_certificate_of_another_run_is_refused() -> None:
    reason = authorize(Identity(Role.OPERATOR, "alice", "other-111111111111"), RUN, "/sitemesh.v1.Admin/Status", None)
    assert reason == f"certificate of run other-111111111111, this peer serves run {RUN}"


def test_one_process_per_data_dir(tmp_path: Path) -> None:
    held = lock_dir(tmp_path)
    with pytest.raises(DirLocked, match=f"in use by another peer \\(PID {os.getpid()}"):
        lock_dir(tmp_path)  # flock is per open file: a second open in this process conflicts too
    held.close()
    lock_dir(tmp_path).close()
