"""Slurm accounting for the throw-away test cluster (tests/integration/slurm_cluster.py): a private
MariaDB and a `slurmdbd` on it, so `sacct` answers as at a real site. Opt-in
(`slurm_cluster.start(root, accounting=True)`): it costs seconds the other Slurm tests do not pay.

    .venv/bin/python -m pytest tests/integration/test_autopilot_sacct.py -v

Needs Debian's slurmdbd (matching slurm-wlm) and mariadb-server (scripts/setup_slurm_packages.sh);
otherwise the tests that use it are skipped with the reason. All of it lives under the cluster's
root: the database's data dir and socket (`db/`), slurmdbd.conf next to slurm.conf (slurmdbd has
no -f: it reads the slurmdbd.conf beside $SLURM_CONF), pid files and logs. The database listens on
127.0.0.1 at a free port (slurmdbd's MySQL client takes a host and port, not a socket) and
slurmdbd at another, so it runs beside any other cluster on the machine.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

_BINARIES = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct", "sacctmgr")
_USER, _PASSWORD, _DB = "slurm", "sitemesh-test", "slurm_acct_db"

PID_FILES = ("slurmdbd.pid", "db/pid")
"""Under the cluster's root: stopped with the cluster (slurm_cluster.stop)."""


def skip_reason() -> str | None:
    """Why accounting cannot be added to the local cluster here, or None."""
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        return (f"Slurm accounting not installed (missing {', '.join(missing)}): "
                "run scripts/setup_slurm_packages.sh")
    return None


def slurm_conf(root: Path, dbd_port: int) -> str:
    """slurm.conf's accounting lines for a slurmdbd at `dbd_port`. The connection to slurmdbd is
    authenticated by the munged named in AccountingStoragePass, not AuthInfo's: the cluster's own."""
    return ("AccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={dbd_port}\n"
            f"AccountingStoragePass={root}/munge/socket\n")


def start(root: Path, cluster: str, dbd_port: int, db_port: int, env: dict[str, str]) -> None:
    """Starts MariaDB and slurmdbd under `root` (munged already runs there; `env` names the
    cluster's slurm.conf) and registers `cluster`; RuntimeError with the logs if one does not come up."""
    db = root / "db"
    db.mkdir(mode=0o700)
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}/data", "--user=root",
                    "--auth-root-authentication-method=socket", "--skip-test-db", "--skip-name-resolve"],
                   check=True, capture_output=True, timeout=120)
    with (root / "log" / "mariadb.log").open("w") as log:
        # setsid -f: the server is nobody's child here, so stop() sees it gone once it exits (no zombie).
        subprocess.run(["setsid", "-f", "mariadbd", "--no-defaults", f"--datadir={db}/data", "--user=root",
                        f"--socket={db}/socket", f"--pid-file={db}/pid", "--bind-address=127.0.0.1",
                        f"--port={db_port}", "--skip-name-resolve", "--skip-log-bin",
                        # A test database: small, and no fsync per commit (slurmdbd creates ~40 tables).
                        "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=0"],
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    grant = (f"CREATE USER '{_USER}'@'127.0.0.1' IDENTIFIED BY '{_PASSWORD}'; "
             f"GRANT ALL ON {_DB}.* TO '{_USER}'@'127.0.0.1';")
    _until(lambda: subprocess.run(["mariadb", f"--socket={db}/socket", "-u", "root", "-e", grant],
                                  capture_output=True).returncode == 0, 60, "MariaDB", root)
    conf = Path(env["SLURM_CONF"]).with_name("slurmdbd.conf")
    conf.touch(mode=0o600)  # slurmdbd refuses a slurmdbd.conf others can read (it holds the password)
    conf.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort={dbd_port}
SlurmUser=root
PidFile={root}/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser={_USER}
StoragePass={_PASSWORD}
StorageLoc={_DB}
""")
    subprocess.run(["slurmdbd"], check=True, capture_output=True, env=env, timeout=60)

    def answers() -> bool:
        return subprocess.run(["sacctmgr", "-n", "show", "cluster"], env=env, capture_output=True,
                              timeout=30).returncode == 0
    _until(answers, 60, "slurmdbd", root)
    subprocess.run(["sacctmgr", "-i", "add", "cluster", cluster], check=True, capture_output=True, env=env,
                   timeout=30)


def _until(ready: Callable[[], bool], timeout_s: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in (root / "log").glob("*.log"))
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s:\n{logs}")
        time.sleep(0.2)
