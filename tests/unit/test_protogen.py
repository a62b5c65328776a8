"""The committed generated code matches what protoc produces from protos/ today."""

from __future__ import annotations

import filecmp
from pathlib import Path

from peer import protogen


def _tree(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    fresh, committed = _tree(tmp_path), _tree(protogen.GEN_ROOT)
    assert sorted(fresh) == sorted(committed), "run `python -m peer.protogen` and commit peer/gen/"
    stale = [name for name in fresh if not filecmp.cmp(fresh[name], committed[name], shallow=False)]
    assert not stale, f"stale generated files {stale}: run `python -m peer.protogen`"
