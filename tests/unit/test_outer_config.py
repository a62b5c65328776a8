"""The outer step's default learning rate (peer/outer_config.lr_for) and how `peer serve` derives
it from the run's length."""

from __future__ import annotations

from peer.cli import _training_from, build_parser
from peer.outer_config import LONG_RUN_LR, LONG_RUN_ROUNDS, SHORT_RUN_ROUNDS, SPARSE_OUTER, OuterConfig, lr_for


def test_a_short_run_takes_the_plain_mean_and_a_long_one_a_damped_step() -> None:
    assert lr_for(1) == lr_for(12) == lr_for(SHORT_RUN_ROUNDS) == 1.0
    between = [lr_for(r) for r in range(SHORT_RUN_ROUNDS, LONG_RUN_ROUNDS + 1)]
    assert between == sorted(between, reverse=True) and len(set(between)) == len(between), "falls with the run"
    assert lr_for(LONG_RUN_ROUNDS) == lr_for(22) == lr_for(98) == lr_for(10_000) == LONG_RUN_LR == 0.6
    assert abs(lr_for(19) - 0.784) < 0.001  # log-linear: log(19/16) / log(22/16) of the way down


def _outer(*flags: str) -> OuterConfig:
    args = build_parser().parse_args(["serve", "--site", "a", "--train", "micro", *flags])
    outer = _training_from(args)["outer"]
    assert isinstance(outer, OuterConfig)
    return outer


def test_peer_serve_takes_the_lr_for_the_rounds_its_inner_schedule_spans() -> None:
    # 980 steps of H=10 are 98 rounds; 155 steps of 10 (the demo's) 16, a partial round counted.
    assert _outer("--total-steps", "980", "--inner-steps", "10").lr == lr_for(98)
    assert _outer("--total-steps", "155", "--inner-steps", "10").lr == 1.0
    assert _outer("--total-steps", "161", "--inner-steps", "10").lr == lr_for(17) < 1.0


def test_a_given_outer_lr_and_the_sparse_wire_keep_their_own_step() -> None:
    assert _outer("--total-steps", "980", "--inner-steps", "10", "--outer-lr", "0.7").lr == 0.7
    assert _outer("--total-steps", "980", "--inner-steps", "10", "--wire", "sparse").lr == SPARSE_OUTER.lr
