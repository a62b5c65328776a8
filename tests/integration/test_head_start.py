"""A training peer's head start (peer/head_start.py): the data dir is locked and the trainer worker
spawned before the peer imports torch, so the two processes' imports overlap; a locked data dir
spawns nothing. Real `peer.cli` flags, a real micro-model worker, in a fresh interpreter (an
interpreter that already imported torch could not show the order).

    .venv/bin/python -m pytest -q tests/integration/test_head_start.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from peer.trainer.config import REPO_ROOT

SCRIPT = r"""
import asyncio, json, sys, time
from pathlib import Path
from peer.cli import _config_from, build_parser
from peer.dirlock import DirLocked
from peer.head_start import head_start

async def main(data_dir):
    config = _config_from(build_parser().parse_args(
        ["serve", "--site", "a", "--insecure", "--train", "micro", "--max-documents", "8", "--data-dir", data_dir]))
    head = await head_start(config)
    out = {"torch_before_spawn_returned": "torch" in sys.modules, "spawned": head.trainer.spawned}
    config_file = Path(data_dir) / "state" / "trainer-config.json"
    before = config_file.stat().st_mtime_ns
    time.sleep(0.05)
    try:
        await head_start(config)
    except DirLocked as err:
        out["second"] = str(err)
    out["rewritten"] = config_file.stat().st_mtime_ns != before
    hello = await head.trainer.hello()
    out["blocks"] = len(hello.blocks)
    await head.close()
    out["relocked"] = (await head_start(config)) is not None  # lock dropped; spawns a worker again
    print(json.dumps(out))
    sys.exit(0)  # the third head start's worker dies with this process

asyncio.run(main(sys.argv[1]))
"""


def test_the_trainer_is_spawned_before_torch_is_imported_and_a_locked_dir_spawns_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "a"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(data_dir)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["spawned"] and not out["torch_before_spawn_returned"], out
    assert "is in use by another peer" in out.get("second", ""), out
    assert out["blocks"] > 0, "the head-started worker answers hello with the corpus' blocks"
    assert not out["rewritten"], "the refused head start touched the holder's trainer files"
    assert out["relocked"], out
