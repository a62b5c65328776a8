"""The `cluster` fixture: real `peer serve` processes on loopback, killed when the test ends.

A module picks the timing preset its processes run with by setting `PRESET` (default
"local_test"); tests that train or measure elections under load use "lan". `tls_cluster` is the same
with mutual TLS: a run CA and certificates made in the test's directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.peers import Cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, preset=getattr(request.module, "PRESET", "local_test"))
    yield c
    c.close()


@pytest.fixture
def tls_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, preset=getattr(request.module, "PRESET", "local_test"), tls=True)
    yield c
    c.close()
