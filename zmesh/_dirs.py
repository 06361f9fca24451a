"""Directories zmesh creates for the user (a data dir, a key directory, a snapshot's
destination): made with their parents, or refused in one line that says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def make_dir(path: Path, what: str, error: Callable[[str], Exception]) -> None:
    """Create directory ``path`` and its parents unless it is one; otherwise raise
    ``error(message)``: ``path`` is a file, or a file on the way, a missing permission."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # (a directory would have been fine)
        raise error(f"{what} {path} exists and is not a directory") from exc
    except OSError as exc:
        raise error(f"cannot create {what} {path}: {exc.strerror}") from exc
