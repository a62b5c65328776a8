"""The house rules that no linter checks for us (docs/layers.md, ../shared/design/style.md).

- Reading a run file (peer.config) loads neither torch nor grpc: `ops` and tools read run files
  on login nodes where neither may be installed, and a settings module that pulls in the
  runtime is a layer upside down.
- Every top-level module and package of peer/ is named in the layers contract: import-linter
  checks only the modules a contract names, so a new module left out would escape it.
- The picture in docs/layers.md names every layer of the contract, in the contract's order: the
  picture is what a reader trusts, and it went stale once (relay and reach were missing).
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


def test_a_peer_process_does_not_load_transformers() -> None:
    """Only the trainer worker builds models: the peer needs transformers to write a checkpoint, and
    importing it at start-up cost each soak job 5-15 s of its allocation (under load) before it
    could join."""
    code = "import sys, peer.node, peer.cli; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "importing peer.node loaded transformers"


def _layers() -> list[str]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["peer"]]
    return list(layers["layers"])


def test_every_top_level_module_of_peer_is_in_the_layers_contract() -> None:
    named = {name.strip() for row in _layers() for name in row.replace("|", ":").split(":")}
    present = {p.stem for p in (REPO / "peer").glob("*.py") if p.name != "__init__.py"}
    present |= {p.parent.name for p in (REPO / "peer").glob("*/__init__.py")}
    assert present - named == set(), "add these to the layers contract in pyproject.toml (docs/layers.md)"
    assert named - present == set(), "the layers contract names modules that do not exist"


def test_the_picture_of_the_layers_matches_the_contract() -> None:
    text = (REPO / "docs" / "layers.md").read_text()
    picture = text.split("```")[1]
    # A row's names, as the picture spells them (a long row wraps onto the next line).
    words = [w for line in picture.splitlines() for w in line.split() if w not in (":", "|")]
    at = 0
    for row in _layers():
        for name in (n.strip() for n in row.replace("|", ":").split(":")):
            assert name in words[at:], f"docs/layers.md does not draw {name!r} (row {row!r}) below the rows above it"
            at = words.index(name, at)


def test_no_hand_written_module_is_over_600_lines() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for top in ("peer", "ops") for p in (REPO / top).rglob("*.py") if "gen" not in p.relative_to(REPO).parts}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert over == {}, f"split these by idea (at most {MAX_LINES} lines): {over}"
