"""`ops status` shows the round core's newest decision (StatusReply.training.last_decision): in the
--json document and as the table's `last decision:` line; absent (null, no line) before the first.

    .venv/bin/python -m pytest -q tests/unit/test_status_decision.py
"""

from __future__ import annotations

from ops import mesh
from peer.gen.sitemesh.v1 import admin_pb2

REASON = "round 9: b: excluded: block 1005: samples 0..16 were not leased to b for round 9"


def _reply(decision: str) -> admin_pb2.StatusReply:
    return admin_pb2.StatusReply(self="a", version="test", consensus=admin_pb2.ConsensusStatus(role="leader"),
                                 training=admin_pb2.TrainingStatus(applied_round=9, last_decision=decision))


def test_the_last_decision_and_its_reason_are_in_the_document_and_the_table() -> None:
    doc = mesh.status_document(_reply(REASON))
    assert doc["training"]["last_decision"] == REASON
    assert f"last decision: {REASON}" in mesh._table(doc).splitlines()


def test_no_decision_yet_is_null_and_no_line() -> None:
    doc = mesh.status_document(_reply(""))
    assert doc["training"]["last_decision"] is None
    assert "last decision" not in mesh._table(doc)
