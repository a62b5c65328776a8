"""`peer serve` refuses bad input with one clear line and exit code 2."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

from peer.job_record import read_dir
from tests.integration.peers import REPO, _env


def _serve(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peer.cli", "serve", "--insecure", *args], capture_output=True,
                          text=True, env=_env(), cwd=REPO, timeout=timeout)


def test_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _serve("--site", "a", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_a_training_peer_that_cannot_start_still_leaves_its_job_record(tmp_path: Path) -> None:
    """The allocation was spent even though the peer never ran: the accounting must see the job."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _serve("--site", "a", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path),
                        "--train", "micro")
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    (record,) = read_dir(tmp_path)
    assert record.member == "a" and record.first_step is None and record.inner_s == 0.0


def test_negative_leave_before() -> None:
    result = _serve("--site", "a", "--leave-before", "-5")
    assert result.returncode == 2
    assert "--leave-before -5: give 0 or more seconds" in result.stderr


def test_malformed_address() -> None:
    result = _serve("--site", "a", "--listen", "localhost-7001")
    assert result.returncode == 2
    assert "malformed listen address 'localhost-7001'" in result.stderr


def test_unknown_config_key(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('[sites.a]\nlisten = "127.0.0.1:0"\nlisten_port = 7\n')
    result = _serve("--config", str(run), "--site", "a")
    assert result.returncode == 2
    assert "unknown key(s) listen_port in [sites.a]" in result.stderr


def test_missing_site_section(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('[sites.a]\nlisten = "127.0.0.1:0"\n')
    result = _serve("--config", str(run), "--site", "zz")
    assert result.returncode == 2
    assert "no [sites.zz] section (sites in the file: a)" in result.stderr


def test_unreachable_seeds_give_up_after_backoff() -> None:
    result = _serve("--site", "a", "--listen", "127.0.0.1:0", "--preset", "local_test",
                    "--join", "127.0.0.1:1", "--join-timeout", "3")
    assert result.returncode == 2
    assert "no seed of 127.0.0.1:1 answered within 3 s" in result.stderr
    attempts = int(re.search(r"\((\d+) attempts\)", result.stderr).group(1))  # type: ignore[union-attr]
    assert attempts >= 2, "must retry before giving up"
