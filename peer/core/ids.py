"""The id types of the protocol, one per concept, in one place: every core and edge names sites,
epochs, rounds, log positions, blocks, lease generations and data epochs with these.

NewTypes cost nothing at run time (a SiteId is a str) and let mypy catch a round passed where a log
index belongs. `peer.core.election`, `peer.core.commitlog` and `peer.core.lease_types` re-export the ones they
used to define, so older imports keep working.

    .venv/bin/python -c "from peer.core.ids import Round, SiteId; print(Round(3), SiteId('a'))"
"""

from __future__ import annotations

from typing import NewType

SiteId = NewType("SiteId", str)
"""A site's name (`peer serve --site NAME`), stable across restarts."""

Epoch = NewType("Epoch", int)
"""Raft's term: grows only, fsynced before any vote or message carrying it is sent."""

Round = NewType("Round", int)
"""An outer round; consecutive in the log, 0 = before the first round."""

LogIndex = NewType("LogIndex", int)
"""A position in the replicated log, from 1; 0 = before the first entry."""

BlockId = NewType("BlockId", int)
"""A block of the dataset (samples are leased and committed per block)."""

Gen = NewType("Gen", int)
"""Lease generation of a block: bumped on every change of holder; the fencing token a holder
presents. Minted as max(gen + 1, mint_base(ring_version, boot)), so a generation minted under a newer
ring view, or by the same primary after a restart in the same view (a higher boot), is above any
minted before: a record rebuilt from the log can never reissue a generation."""

DataEpoch = NewType("DataEpoch", int)
"""Pass over the dataset, from 0; advanced by the log when every sample of it is committed."""
