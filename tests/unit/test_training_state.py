"""The training edge's checks on what it installs (peer/training.py): averaging weights against the
round's tokens, and state transfer (`catch_up`) only of the committed θ. Real exchange servers on
loopback, no trainer process (θ is a small state dict here).

    .venv/bin/python -m pytest -q tests/unit/test_training_state.py
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from peer.core.commitlog import RoundCommit
from peer.exchange.allreduce import publish_pseudo_gradient
from peer.outer import state_dict_hash
from peer.trainer.config import MODEL_PRESETS, DataConfig, TrainerConfig
from peer.outer_config import OuterConfig
from peer import round_exchange
from peer.round_exchange import InvalidContribution, Unavailable
from peer.theta_store import AppliedState, state_tensors
from peer.training import SiteTraining
from tests.support.exchange import random_model, serving

SIZES = {"w": (33, 7), "b": (5,)}


def site(name: str, tmp: Path, seed: int = 0) -> SiteTraining:
    t = SiteTraining(name, tmp / name, TrainerConfig(MODEL_PRESETS["micro"], DataConfig.shipped()), OuterConfig())
    t.weights = random_model(seed, SIZES)
    t.momentum = {n: torch.zeros_like(v) for n, v in t.weights.items()}
    t.weights_hash = bytes.fromhex(state_dict_hash(t.weights))
    return t


def test_a_manifest_whose_tokens_differ_from_the_round_is_an_invalid_contribution(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = site("a", tmp_path), site("b", tmp_path)
        delta = {n: v * 0.01 for n, v in random_model(1, SIZES).items()}
        # b reported (and the round names) 40 tokens, but its manifest, the averaging weight, says 50.
        encoded = await publish_pseudo_gradient(b.exchange.store, delta, round=1, site="b", tokens=50)
        root = encoded.manifest.root_hash
        async with serving(b.exchange.store) as address:
            with pytest.raises(InvalidContribution, match="manifest says 50 tokens, the round names 40") as err:
                await a.outcome(1, [("b", address, root, 40)])
            assert err.value.site == "b"
            honest = await a.outcome(1, [("b", address, root, 50)])
            assert honest.weights_hash != a.weights_hash
        await a.close()

    asyncio.run(scenario())


def test_a_root_its_site_does_not_serve_is_that_sites_invalid_contribution(tmp_path: Path) -> None:
    """A report naming a pseudo-gradient root its site does not serve (a bug or a forgery) blames that
    site, so a leader excludes it alone; as a plain hash mismatch it emptied the whole round."""
    async def scenario() -> None:
        a, b = site("a", tmp_path), site("b", tmp_path)
        delta = {n: v * 0.01 for n, v in random_model(1, SIZES).items()}
        encoded = await publish_pseudo_gradient(b.exchange.store, delta, round=1, site="b", tokens=40)
        async with serving(b.exchange.store) as address:
            with pytest.raises(InvalidContribution, match="b serves a pseudo-gradient with root ") as err:
                await a.outcome(1, [("b", address, b"\x5a" * 32, 40)])
            assert err.value.site == "b"
            honest = await a.outcome(1, [("b", address, encoded.manifest.root_hash, 40)])
            assert honest.weights_hash != a.weights_hash
        await a.close()

    asyncio.run(scenario())


def test_contributors_cut_off_after_reporting_cost_the_round_one_manifest_timeout_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two contributors whose links went silent after they reported (a listener that never answers,
    as a network cut leaves one): the first of them is blamed (Unavailable, so the leader decides
    without it) after one MANIFEST_TIMEOUT_S for both, not one each, and not the 20 s it once took."""
    monkeypatch.setattr(round_exchange, "MANIFEST_TIMEOUT_S", 1.0)

    async def scenario() -> None:
        a = site("a", tmp_path)
        with socket.create_server(("127.0.0.1", 0)) as b, socket.create_server(("127.0.0.1", 0)) as c:
            silent = [(name, f"127.0.0.1:{sock.getsockname()[1]}", bytes(32), 40)
                      for name, sock in (("b", b), ("c", c))]
            started = time.monotonic()
            with pytest.raises(Unavailable, match="b's pseudo-gradient") as err:
                await a.outcome(1, silent)
            took = time.monotonic() - started
        assert err.value.site == "b"
        assert 1.0 <= took < 1.8, f"{took:.2f} s: the manifests were not asked at once, or not bounded"
        await a.close()

    asyncio.run(scenario())


def test_a_manifest_asked_for_at_the_report_is_the_one_the_round_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader asks a contributor for its manifest as its report comes (`ask_manifest`): a site
    that went silent after reporting is blamed one MANIFEST_TIMEOUT_S after the report, not after
    the decision; an honest one asked early averages as if asked at the decision."""
    monkeypatch.setattr(round_exchange, "MANIFEST_TIMEOUT_S", 1.0)

    async def scenario() -> None:
        a, b = site("a", tmp_path), site("b", tmp_path)
        delta = {n: v * 0.01 for n, v in random_model(1, SIZES).items()}
        encoded = await publish_pseudo_gradient(b.exchange.store, delta, round=1, site="b", tokens=40)
        fresh = site("a", tmp_path / "fresh")
        async with serving(b.exchange.store) as address:
            contributors = [("b", address, encoded.manifest.root_hash, 40)]
            a.exchange.ask_manifest(1, "b", address, encoded.manifest.root_hash)
            asked = await a.outcome(1, contributors)
            assert asked.weights_hash == (await fresh.outcome(1, contributors)).weights_hash != a.weights_hash
        with socket.create_server(("127.0.0.1", 0)) as silent:
            where = f"127.0.0.1:{silent.getsockname()[1]}"
            a.exchange.ask_manifest(2, "c", where, bytes(32))
            await asyncio.sleep(0.8)  # the round waits for others meanwhile
            started = time.monotonic()
            with pytest.raises(Unavailable, match="c's pseudo-gradient"):
                await a.outcome(2, [("c", where, bytes(32), 40)])
            assert time.monotonic() - started < 0.6, "the decision asked again instead of taking the asked manifest"
        await a.close()
        await b.close()
        await fresh.close()

    asyncio.run(scenario())


def test_a_contributor_killed_after_its_manifest_was_read_is_blamed_at_once(tmp_path: Path) -> None:
    """c reported, the leader read its manifest, then c's process died: the mean's reduction finds
    nothing listening at c and blames c alone (Unavailable, so the leader decides without it)
    at once, instead of retrying a dead peer for 20 s or failing the whole round."""
    async def scenario() -> None:
        a, b, c = site("a", tmp_path), site("b", tmp_path), site("c", tmp_path)
        published = {}
        for n, t in enumerate((a, b, c)):
            delta = {k: v * 0.01 for k, v in random_model(n + 1, SIZES).items()}
            published[t.site] = await publish_pseudo_gradient(t.exchange.store, delta, round=1, site=t.site,
                                                              tokens=40)
        async with serving(b.exchange.store) as at_b:
            async with serving(c.exchange.store) as at_c:
                addresses = {"a": "", "b": at_b, "c": at_c}
                contributors = [(s, addresses[s], e.manifest.root_hash, 40) for s, e in sorted(published.items())]
                for s, address, root, _ in contributors[1:]:
                    a.exchange.ask_manifest(1, s, address, root)
                await asyncio.sleep(0.5)  # the manifests are in; then c is gone
            started = time.monotonic()
            with pytest.raises(Unavailable) as err:
                await asyncio.wait_for(a.outcome(1, contributors), 60)
            took = time.monotonic() - started
        assert err.value.site == "c", err.value
        assert took < 3.0, f"{took:.1f} s: a dead contributor was retried"
        for t in (a, b, c):
            await t.close()

    asyncio.run(scenario())


def test_catch_up_installs_a_peer_state_only_if_its_hash_is_the_committed_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        healthy, behind = site("b", tmp_path, seed=7), site("a", tmp_path, seed=8)
        healthy.applied_round, healthy.applied_index = 3, 12
        await healthy.exchange.publish_state(3, state_tensors(healthy.weights, healthy.momentum))
        async with serving(healthy.exchange.store) as address:
            peers = {"b": address}
            wrong = bytes(32)
            assert not await behind.catch_up(3, 12, wrong, peers), "a state whose hash is not committed"
            assert behind.applied_round == 0 and behind.weights_hash != healthy.weights_hash
            assert await behind.catch_up(3, 12, healthy.weights_hash, peers)
        assert (behind.applied_round, behind.applied_index, behind.weights_hash) == (3, 12, healthy.weights_hash)
        assert all(torch.equal(behind.weights[n], healthy.weights[n]) for n in SIZES)
        assert behind.pointer() == (12, 3), "the transferred state is durable"
        await behind.close()

    asyncio.run(scenario())


def test_a_round_is_written_in_the_background_and_the_next_apply_waits_for_it(tmp_path: Path) -> None:
    """apply(r) returns with θ_r in memory while θ_r is still being written (the next round need not
    wait for the disk); the pointer names r only once its file is durable; apply(r+1) moves θ on
    only after r's writes finished, so they never read a newer θ."""
    t = site("a", tmp_path)
    release, writing = threading.Event(), threading.Event()
    persist = t.states.persist

    def slow_persist(state: AppliedState) -> None:
        writing.set()
        release.wait(30)
        persist(state)

    t.states.persist = slow_persist  # type: ignore[method-assign]

    async def scenario() -> None:
        first = await t.outcome(1, [])
        await asyncio.wait_for(t.install(7, RoundCommit(1, (), first.weights_hash), first), 10)
        assert (t.applied_round, t.weights_hash) == (1, first.weights_hash), "θ_1 in memory at once"
        await asyncio.to_thread(writing.wait, 10)
        assert t.pointer() == (0, 0), "the pointer moves only when θ_1 is durable"
        second = await t.outcome(2, [])
        nxt = asyncio.ensure_future(t.install(8, RoundCommit(2, (), second.weights_hash), second))
        await asyncio.sleep(0.3)
        assert not nxt.done() and t.applied_round == 1, "round 2 waits for round 1's writes"
        release.set()
        await asyncio.wait_for(nxt, 10)
        assert t.applied_round == 2
        await t.settle()
        assert t.pointer() == (8, 2)
        await t.close()

    asyncio.run(scenario())


def test_an_apply_cancelled_too_late_never_undoes_the_state_transfer_that_replaced_it(tmp_path: Path) -> None:
    """The apply queue cancels an apply whose contributor is suspected and catches up by state
    transfer (peer/core/apply.py), but the apply's recompute may be done already: its install of
    round 2 then runs beside the transfer of round 3. One state is installed at a time, and a round
    a transfer covered is not installed after it: θ ends at round 3 either way."""
    healthy, t = site("b", tmp_path, seed=7), site("a", tmp_path)
    healthy.applied_round, healthy.applied_index = 3, 12
    release = threading.Event()
    persist = t.states.persist

    def slow_first(state: AppliedState) -> None:  # round 1's writes are still going on
        if state.round == 1:
            release.wait(30)
        persist(state)

    t.states.persist = slow_first  # type: ignore[method-assign]

    async def scenario() -> None:
        await healthy.exchange.publish_state(3, state_tensors(healthy.weights, healthy.momentum))
        first = await t.outcome(1, [])
        await t.install(7, RoundCommit(1, (), first.weights_hash), first)
        second = await t.outcome(2, [])
        late = asyncio.ensure_future(t.install(8, RoundCommit(2, (), second.weights_hash), second))
        await asyncio.sleep(0.2)  # the late install waits for round 1's writes
        async with serving(healthy.exchange.store) as address:
            transfer = asyncio.ensure_future(t.catch_up(3, 12, healthy.weights_hash, {"b": address}))
            await asyncio.sleep(0.5)
            release.set()
            assert await asyncio.wait_for(transfer, 10)
            await asyncio.wait_for(late, 10)
            assert (t.applied_round, t.weights_hash) == (3, healthy.weights_hash), "round 2 undid the transfer"
            await t.install(8, RoundCommit(2, (), second.weights_hash), second)  # after it: nothing to do
            assert (t.applied_round, t.weights_hash) == (3, healthy.weights_hash)
        await t.settle()
        assert t.pointer() == (12, 3)
        await t.close()
        await healthy.close()

    asyncio.run(scenario())
