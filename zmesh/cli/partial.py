"""The store a command writes into a new data dir (``zmesh snapshot``, ``zmesh store
salvage``), removed when the command is stopped midway: left, a truncated copy would be
taken for a restore, or a sound one holding part of the records for all of them."""

from __future__ import annotations

import contextlib
from pathlib import Path


class NewStore:
    """DEST/store, as it was before a command writes into it: the directories the command
    will make, and whether what it writes there is its own (a store directory that holds
    something already is refused by the copy, and never removed)."""

    def __init__(self, dest: str) -> None:
        self.target = Path(dest) / "store"
        self.made = [p for p in (self.target, *self.target.parents) if not p.exists()]
        try:
            self.own = not self.target.exists() or not any(self.target.iterdir())
        except OSError:
            self.own = False

    def remove(self) -> bool:
        """Remove what was written into the store directory and the directories made for
        it (the deepest first); whether it could be (the store directory was its own)."""
        if not self.own:
            return False
        with contextlib.suppress(OSError):
            for entry in self.target.iterdir():
                entry.unlink()
        for path in self.made:
            with contextlib.suppress(OSError):
                path.rmdir()
        return True
