"""The house rules that no linter checks for us (docs/layers.md, ../shared/design/style.md).

- Reading a run file (peer.config) loads neither torch nor grpc: `ops` and tools read run files
  on login nodes where neither may be installed, and a settings module that pulls in the
  runtime is a layer upside down.
- Every top-level module and package of peer/ is named in the layers contract: import-linter
  checks only the modules a contract names, so a new module left out would escape it.
- No hand-written module is over 600 lines ("when one passes ~600 lines, it is probably two ideas").
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600


def test_reading_a_run_file_loads_neither_torch_nor_grpc() -> None:
    code = ("import sys, peer.config; heavy = sorted(m for m in ('torch', 'grpc', 'transformers') if m in sys.modules); "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import peer.config loaded {out.stdout.strip()}"


def test_every_top_level_module_of_peer_is_in_the_layers_contract() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["peer"]]
    named = {name.strip() for row in layers["layers"] for name in row.replace("|", ":").split(":")}
    present = {p.stem for p in (REPO / "peer").glob("*.py") if p.name != "__init__.py"}
    present |= {p.parent.name for p in (REPO / "peer").glob("*/__init__.py")}
    assert present - named == set(), "add these to the layers contract in pyproject.toml (docs/layers.md)"
    assert named - present == set(), "the layers contract names modules that do not exist"


def test_no_hand_written_module_is_over_600_lines() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for top in ("peer", "ops") for p in (REPO / top).rglob("*.py") if "gen" not in p.relative_to(REPO).parts}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert over == {}, f"split these by idea (at most {MAX_LINES} lines): {over}"
