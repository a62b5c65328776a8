"""Only the run's sites may speak: real `peer serve` processes with mutual TLS, probed as an attacker.

Each refusal is checked twice: the call gets the refusal (code and reason), and the peer keeps
serving with its state intact.

    .venv/bin/python -m pytest -q tests/integration/test_security.py
"""

from __future__ import annotations

import datetime
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from ops.certs import LOOPBACK, init_ca, issue
from peer.core.commitlog import AppendEntries, Entry, InstallSnapshot, LogIndex, Round, RoundCommit, Snapshot
from peer.core.election import Epoch, Header, SiteId
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc, common_pb2, consensus_pb2, membership_pb2
from peer.transport.channels import PLAINTEXT, Credentials, open_blocking_channel
from peer.transport.consensus_rpc import CONSENSUS
from peer.transport.wire import to_proto
from tests.integration.peers import REPO, Cluster, _env, ops, wait_for

SETTLE_S = 30.0


@pytest.fixture
def tls(tmp_path: Path):
    c = Cluster(tmp_path, tls=True)
    yield c
    c.close()


def _push_pull(address: str, creds: Credentials, msg: membership_pb2.PushPull) -> grpc.RpcError | None:
    with open_blocking_channel(address, creds) as channel:
        call = channel.unary_unary("/sitemesh.v1.Membership/SendPushPull",
                                   request_serializer=membership_pb2.PushPull.SerializeToString,
                                   response_deserializer=common_pb2.Accepted.FromString)
        try:
            call(msg, timeout=10)
        except grpc.RpcError as err:
            return err
    return None


def _status_call(address: str, creds: Credentials) -> admin_pb2.StatusReply:
    with open_blocking_channel(address, creds) as channel:
        return admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=10)


def _leave_call(address: str, creds: Credentials) -> grpc.RpcError | None:
    with open_blocking_channel(address, creds) as channel:
        try:
            admin_pb2_grpc.AdminStub(channel).Leave(admin_pb2.LeaveRequest(), timeout=10)
        except grpc.RpcError as err:
            return err
    return None


def _mesh(tls: Cluster, sites: tuple[str, ...] = ("a", "b", "c")) -> None:
    first = tls.start(sites[0])
    for site in sites[1:]:
        tls.start(site, join=[first.address])
    wait_for(lambda: all(len([m for m in tls.status(p.address)["members"] if m["state"] == "alive"]) == len(sites)
                         for p in tls.peers.values()), SETTLE_S, "the TLS mesh to converge")


def test_tls_mesh_forms_and_roles_are_enforced(tls: Cluster) -> None:
    _mesh(tls)
    a = tls.peers["a"]
    issue(tls.certs, "bob", "reader", tls.certs)
    reader = Credentials.from_dir(tls.certs, "bob")
    site_b = Credentials.from_dir(tls.certs, "b")
    # A reader reads, and may not make a peer leave; nor may a site.
    assert _status_call(a.address, reader).self == "a"
    for creds, who in ((reader, "reader bob"), (site_b, "site b")):
        err = _leave_call(a.address, creds)
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED, err
        assert f"{who} may not call Admin/Leave (operators only)" in err.details()
    # Logged once per (peer, method), however often it is tried.
    _leave_call(a.address, reader)
    assert a.log().count("refused /sitemesh.v1.Admin/Leave from bob") == 1
    # grpcurl with the run's certificates (README, Security), and consensus.proto's example.
    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")

    def curl(who: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([grpcurl, "-cacert", str(tls.certs / "ca.crt"), "-cert", str(tls.certs / f"{who}.crt"),
                               "-key", str(tls.certs / f"{who}.key"), *args], capture_output=True, text=True,
                              timeout=30, check=False)

    assert "sitemesh.v1.Admin" in curl("bob", a.address, "list").stdout
    assert '"self": "a"' in curl("bob", a.address, "sitemesh.v1.Admin/Status").stdout
    vote = curl("b", "-d", '{"header": {"from_site": "b", "epoch": 1}, "proposed_epoch": 2, "pre_vote": true}',
                a.address, "sitemesh.v1.Consensus/SendRequestVote")
    assert vote.returncode == 0, vote.stderr
    refused = curl("bob", "-d", "{}", a.address, "sitemesh.v1.Consensus/SendRequestVote")
    assert "PermissionDenied" in refused.stderr and "reader bob may not call" in refused.stderr, refused.stderr
    result = tls.ops("leave", "--peer", a.address)  # the operator's: accepted
    assert result.returncode == 0, result.stderr
    wait_for(lambda: a.proc.poll() is not None, SETTLE_S, "a to leave on the operator's request")


def test_connections_without_a_run_certificate_are_refused(tls: Cluster, tmp_path: Path) -> None:
    a = tls.start("a")
    other = tmp_path / "other-run"
    init_ca("other", other)
    issue(other, "a", "site", other, LOOPBACK)
    issue(other, "eve", "operator", other)
    expired_dir = tmp_path / "expired"
    expired_dir.mkdir()
    shutil.copy(tls.certs / "ca.crt", expired_dir / "ca.crt")
    issue(tls.certs, "old", "operator", expired_dir, days=1,
          now=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=3))
    ca, op = (tls.certs / "ca.crt").read_bytes(), Credentials.from_dir(tls.certs, "operator")
    eve = Credentials.from_dir(other, "eve")
    cases = {
        "plaintext client": PLAINTEXT,
        "operator of another run's CA": Credentials(ca, eve.cert, eve.key, "eve"),
        "expired certificate": Credentials.from_dir(expired_dir, "old"),
    }
    for what, creds in cases.items():
        with pytest.raises(grpc.RpcError) as err:
            _status_call(a.address, creds)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
    # No client certificate at all: TLS to the right server, but nothing to show.
    with grpc.secure_channel(a.address, grpc.ssl_channel_credentials(root_certificates=ca)) as channel:
        with pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _status_call(a.address, op).self == "a", "the peer must keep serving its run"
    # A server certificate without the dialled host in its SAN: the client refuses the server.
    issue(tls.certs, "w", "site", tls.certs, ("w.example",))
    w = tls.start("w")
    with pytest.raises(grpc.RpcError) as err:
        _status_call(w.address, op)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_site_cannot_speak_for_another(tls: Cluster) -> None:
    _mesh(tls, ("a", "b"))
    a = tls.peers["a"]
    forged = membership_pb2.PushPull(from_site="b", from_address="127.0.0.1:1", members=[
        membership_pb2.MemberUpdate(site="b", state=membership_pb2.MEMBER_STATE_LEFT, incarnation=2**64 - 1,
                                    from_site="b")])
    issue(tls.certs, "c", "site", tls.certs, LOOPBACK)  # a site of the run that never started
    err = _push_pull(a.address, Credentials.from_dir(tls.certs, "c"), forged)
    assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "site c sent SendPushPull as 'b'" in err.details()
    assert {m["site"]: m["state"] for m in tls.status(a.address)["members"]} == {"a": "alive", "b": "alive"}


def test_duplicate_site_and_other_run_are_refused(tls: Cluster, tmp_path: Path) -> None:
    _mesh(tls, ("a", "b"))
    a = tls.peers["a"]
    # A second live process under b's name (b's own certificate, copied): refused, b stays.
    dup = subprocess.run(
        [sys.executable, "-m", "peer.cli", "serve", "--site", "b", "--listen", "127.0.0.1:0", "--preset",
         "local_test", "--data-dir", str(tmp_path / "b2"), "--certs", str(tls.certs), "--join", a.address,
         "--join-timeout", "3"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60, check=False)
    assert dup.returncode == 2
    assert "site b is live at" in dup.stderr and "a second process with its name" in dup.stderr, dup.stderr
    # A peer of another run (its own CA) cannot even connect.
    other = tmp_path / "other-run"
    init_ca("other", other)
    issue(other, "z", "site", other, LOOPBACK)
    alien = subprocess.run(
        [sys.executable, "-m", "peer.cli", "serve", "--site", "z", "--listen", "127.0.0.1:0", "--preset",
         "local_test", "--data-dir", str(tmp_path / "z"), "--certs", str(other), "--join", a.address,
         "--join-timeout", "3"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60, check=False)
    assert alien.returncode == 2 and "certificates of the same run CA" in alien.stderr, alien.stderr
    members = {m["site"]: (m["state"], m["address"]) for m in tls.status(a.address)["members"]}
    assert members == {"a": ("alive", a.address), "b": ("alive", tls.peers["b"].address)}


def test_one_process_per_data_dir_and_port(tls: Cluster) -> None:
    a = tls.start("a")
    port = a.address.rsplit(":", 1)[1]

    def second(listen: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "peer.cli", "serve", "--site", "a", "--listen", listen, "--data-dir",
             str(data_dir), "--certs", str(tls.certs)],
            capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60, check=False)

    same_dir = second("127.0.0.1:0", tls.workdir / "a")
    assert same_dir.returncode == 2
    assert f"is in use by another peer (PID {a.proc.pid}" in same_dir.stderr, same_dir.stderr
    same_port = second(f"127.0.0.1:{port}", tls.workdir / "elsewhere")
    assert same_port.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in same_port.stderr, same_port.stderr
    assert tls.status(a.address)["self"] == "a"


def test_a_certificate_must_be_the_sites_own(tls: Cluster) -> None:
    tls.start("a")  # makes the CA and a's certificate
    shutil.copy(tls.certs / "operator.crt", tls.certs / "b.crt")
    shutil.copy(tls.certs / "operator.key", tls.certs / "b.key")
    result = subprocess.run(
        [sys.executable, "-m", "peer.cli", "serve", "--site", "b", "--certs", str(tls.certs)],
        capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60, check=False)
    assert result.returncode == 2
    assert "is the operator certificate of 'operator', not the site certificate of 'b'" in result.stderr


def _raw(address: str, creds: Credentials, method: str, payload: bytes) -> grpc.RpcError | None:
    with open_blocking_channel(address, creds) as channel:
        try:
            channel.unary_unary(method)(payload, timeout=10)
        except grpc.RpcError as err:
            return err
    return None


def test_hostile_messages_of_an_authenticated_site_are_refused(tls: Cluster) -> None:
    """c holds a real site certificate of the run and sends what the issue's attacker sent."""
    a = tls.start("a", extra=["--round-interval", "0.5"])
    b = tls.start("b", join=[a.address], extra=["--round-interval", "0.5"])
    wait_for(lambda: tls.status(a.address)["committed_round"] >= 2 and tls.status(b.address)["leader"], SETTLE_S,
             "rounds to commit")
    issue(tls.certs, "c", "site", tls.certs, LOOPBACK)
    c = Credentials.from_dir(tls.certs, "c")
    header = consensus_pb2.ConsensusHeader(from_site="c", from_address="127.0.0.1:1", epoch=2**64 - 1)
    fake = [membership_pb2.MemberUpdate(site=f"fake{i}", state=membership_pb2.MEMBER_STATE_ALIVE, incarnation=1,
                                        from_site="c") for i in range(2000)]
    snapshot = consensus_pb2.InstallSnapshot(
        header=consensus_pb2.ConsensusHeader(from_site="b", from_address=b.address, epoch=99),
        snapshot=consensus_pb2.Snapshot(last_index=1_000_000, last_epoch=99))
    attacks = {
        "/sitemesh.v1.Consensus/SendAppendEntries":
            (consensus_pb2.AppendEntries(header=header).SerializeToString(), grpc.StatusCode.INVALID_ARGUMENT),
        "/sitemesh.v1.Membership/SendPushPull":
            (membership_pb2.PushPull(from_site="c", from_address="127.0.0.1:1", members=fake).SerializeToString(),
             grpc.StatusCode.INVALID_ARGUMENT),
        "/sitemesh.v1.Consensus/SendInstallSnapshot":
            (snapshot.SerializeToString(), grpc.StatusCode.PERMISSION_DENIED),
        "/sitemesh.v1.Consensus/SendRequestVote": (b"\xff\x00garbage" * 50, grpc.StatusCode.INVALID_ARGUMENT),
    }
    before = {p.site: tls.status(p.address) for p in (a, b)}
    for method, (payload, code) in attacks.items():
        for target in (a, b):
            err = _raw(target.address, c, method, payload)
            assert err is not None and err.code() == code, (method, err)
    # Everyone keeps serving and agrees on an honest leader at a small epoch; rounds keep committing.
    wait_for(lambda: tls.status(a.address)["committed_round"] >= before["a"]["committed_round"] + 2, SETTLE_S,
             "rounds to go on committing")
    for p in (a, b):
        now = tls.status(p.address)
        # The attacker's epochs were 99 and 2^64-1: neither took. (Honest elections may still raise
        # the epoch by a dozen on a machine loaded enough to starve the leader's lease renewals.)
        assert before[p.site]["epoch"] <= now["epoch"] < 99 and now["leader"] in ("a", "b")
        assert {m["site"] for m in now["members"]} == {"a", "b"}
        assert "Traceback" not in p.log(), p.log()[-3000:]


def test_ops_place_reads_an_mtls_peer(tls: Cluster, tmp_path: Path) -> None:
    """`ops place --peer` dials with --certs like every ops command (it spoke only plaintext)."""
    a = tls.start("a")
    run_file = tmp_path / "run.toml"
    # The peer is asked first; the Slurm probe after it cannot run here, which shows the call passed.
    run_file.write_text('[placement]\ntarget_tokens = 1.0\nprobe_timeout_s = 5\n[sites.a.slurm]\nnodes = 1\n'
                        'time = "1"\ncommand_prefix = ["/nonexistent/login"]\n')
    plain = ops("place", "--config", str(run_file), "--peer", a.address)
    assert plain.returncode == 1 and f"peer {a.address} did not answer Admin/Status: UNAVAILABLE" in plain.stderr
    nobody = ops("place", "--config", str(run_file), "--peer", a.address, "--certs", str(tls.certs), "--as", "x")
    assert nobody.returncode == 1 and "x.crt does not exist" in nobody.stderr, nobody.stderr
    placed = tls.ops("place", "--config", str(run_file), "--peer", a.address)
    assert placed.returncode == 1, placed.stderr
    assert "did not answer Admin/Status" not in placed.stderr
    assert "error: site a: cannot run /nonexistent/login" in placed.stderr, placed.stderr


def _consensus_send(address: str, creds: Credentials, msg: object) -> grpc.RpcError | None:
    """One consensus message as the core would send it (peer/transport/consensus_rpc.py's route)."""
    route = CONSENSUS.route_of(msg)
    return _raw(address, creds, f"/{CONSENSUS.full_name}/{route.method}",
                to_proto(msg, route.proto_cls).SerializeToString())


def test_stale_epoch_replays_and_epoch_jumps_are_fenced(tls: Cluster) -> None:
    """The leader's own messages of an epoch that is over (a paused leader's, a delayed or duplicated
    delivery) are fenced by every peer, and a site outside the voters cannot jump the epoch."""
    sites = ("a", "b", "c")
    first = tls.start("a", extra=["--round-interval", "0.5"])
    for site in sites[1:]:
        tls.start(site, join=[first.address], extra=["--round-interval", "0.5"])
    wait_for(lambda: len(tls.status(first.address)["voters"]) == 3 and tls.status(first.address)["committed_round"]
             >= 2, SETTLE_S, "three voters and committed rounds")
    old = tls.status(first.address)
    leader, old_epoch = tls.peers[old["leader"]], old["epoch"]
    others = [tls.peers[s] for s in sites if s != leader.site]
    as_leader = Credentials.from_dir(tls.certs, leader.site)
    # What the leader of old_epoch could send: an entry 1 and a snapshot far ahead, each of which,
    # if believed, would cut the followers' logs.
    header = Header(SiteId(leader.site), leader.address, Epoch(old_epoch), 0)
    rewrite = AppendEntries(header, LogIndex(0), Epoch(0),
                            (Entry(LogIndex(1), Epoch(old_epoch), RoundCommit(Round(1), (), b"forged")),),
                            LogIndex(1), 10**6)
    snapshot = InstallSnapshot(header, Snapshot(LogIndex(10**6), Epoch(old_epoch), Round(10**6), b"x", ()), 10**6)
    leader.proc.send_signal(signal.SIGSTOP)  # the others elect a new leader in a later epoch
    wait_for(lambda: all(tls.status(p.address)["epoch"] > old_epoch and tls.status(p.address)["leader"]
                         for p in others), SETTLE_S, "a new leader in a later epoch")
    leader.proc.send_signal(signal.SIGCONT)
    before = {p.site: tls.status(p.address) for p in others}
    for p in others:
        for msg in (rewrite, snapshot):
            assert _consensus_send(p.address, as_leader, msg) is None  # one-way: delivered, then fenced
    # A site of the run that is not a voter claims an epoch 10^6 above: ignored, not adopted.
    issue(tls.certs, "d", "site", tls.certs, LOOPBACK)
    jump = AppendEntries(Header(SiteId("d"), "127.0.0.1:1", Epoch(before[others[0].site]["epoch"] + 10**6), 0),
                         LogIndex(0), Epoch(0), (), LogIndex(0), 1)
    for p in others:
        assert _consensus_send(p.address, Credentials.from_dir(tls.certs, "d"), jump) is None
    wait_for(lambda: tls.status(first.address)["committed_round"] >= before[others[0].site]["committed_round"] + 2,
             SETTLE_S, "rounds to go on committing")
    for p in tls.peers.values():
        now = tls.status(p.address)
        assert now["epoch"] < old_epoch + 100, now["epoch"]
        assert now["voters"] == old["voters"] and now["leader"] in sites
        if p.site in before:
            assert now["consensus"]["commit_index"] >= before[p.site]["consensus"]["commit_index"]
            assert now["committed_round"] >= before[p.site]["committed_round"]
        assert "Traceback" not in p.log(), p.log()[-3000:]
    assert any("implausible epoch" in p.log() for p in others)


def test_an_insecure_peer_of_another_run_is_refused(tmp_path: Path) -> None:
    """Without certificates the run id still travels (the user agent of every call): a plaintext
    peer of another run is refused with the reason; one of the same run joins."""
    plain = Cluster(tmp_path)
    files = {}
    for run in ("x", "y"):
        files[run] = tmp_path / f"{run}.toml"
        files[run].write_text(f'[run]\nname = "{run}"\ninsecure = true\n[sites.a]\n[sites.b]\n[sites.c]\n')
    try:
        a = plain.start("a", extra=["--config", str(files["x"])])
        alien = subprocess.run(
            [sys.executable, "-m", "peer.cli", "serve", "--config", str(files["y"]), "--site", "b", "--listen",
             "127.0.0.1:0", "--preset", "local_test", "--data-dir", str(tmp_path / "b"), "--join", a.address,
             "--join-timeout", "3"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60, check=False)
        assert alien.returncode == 2
        assert "PERMISSION_DENIED: caller of run y, this peer serves run x" in alien.stderr, alien.stderr
        assert [m["site"] for m in plain.status(a.address)["members"]] == ["a"]
        # Logged once per method refused (the reachability check's DialBack, then the join), then counted.
        refused = [line.split("refused ", 1)[1].split(" ", 1)[0] for line in a.log().splitlines()
                   if "caller of run y, this peer serves run x" in line]
        assert refused and len(refused) == len(set(refused)), refused
        plain.start("c", join=[a.address], extra=["--config", str(files["x"])])
        wait_for(lambda: len(plain.status(a.address)["members"]) == 2, SETTLE_S, "c of the same run to join")
    finally:
        plain.close()
