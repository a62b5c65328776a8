"""A trainer process (worker or launcher) dies with the node that spawned it."""

from __future__ import annotations

import ctypes
import signal
import sys


def die_with_parent() -> None:
    """Have Linux SIGKILL us when the node dies. End of stdin also says so, but only once the command
    in flight is done, and an orphan still in a long round would hold the GPU that the restarted
    node's new worker needs. (A node that died before this call is caught by the end of stdin.)"""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
