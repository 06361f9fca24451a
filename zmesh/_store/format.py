"""The store's format number, kept in ``meta`` as ``format``: what a release needs to be
able to read to open a data dir.

A release reads the records of every release before it (a record written before a change
is told by its shape: ``damage.decode_record``, ``decode_run``, a lane entry's length), so
moving a data dir forward needs nothing. Going back is another matter: a release that
met a record it cannot decode would set it aside as damaged and leave undelivered the
messages it stands for. ``FORMAT`` is raised by a change whose records the releases before
it cannot read; a store stamped with a higher number than the running release's is
refused at open, before anything is read or written, with what to do. A store stamped
with none (written before the number existed) is format 1.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import StoreError

FORMAT = 1
KEY = b"format"  # in ``meta``: u32, big-endian


def check_format(raw: bytes | None, store_path: str) -> None:
    """Refuse a store a later release wrote in a format this one cannot read."""
    found = 1 if raw is None else int.from_bytes(raw, "big")
    if found > FORMAT:
        data_dir = Path(store_path).parent
        raise StoreError(
            f"the data dir {data_dir} was written by a later zmesh release (store format "
            f"{found}; this release reads up to {FORMAT}): run that release or a later "
            "one on it (drain its outbox there first to move the node back), or restore "
            "the data dir from a snapshot taken before the upgrade",
            store_path,
        )
