"""Finding damage in a store before LMDB reads it.

LMDB trusts its file: a damaged branch or leaf page makes it fail an assertion and abort
the process (``mdb.c: Assertion 'IS_LEAF(mp)' failed``), or return MDB_CORRUPTED and
leave the transaction unusable. So a store that is not known to be as a clean close left
it (lock.py) is walked first, page by page, by ``lmdb.verify``: every page reachable from
both meta pages' roots, of every database (branch, leaf and overflow pages, keys in
order, counters, the free list, each page reachable once). It reads the file with plain
``read`` calls and never hands it to liblmdb, and it runs in a child process, so nothing
it meets can stop the node's process. It takes about 20 s per GiB of small records
(docs/operations.md).

The child runs ``CHILD`` below, which imports ``lmdb.verify`` alone (importing zmesh
would add most of a second to each check).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHILD = """\
import json, sys, time
from lmdb import verify
start = time.monotonic()
fatal = None
try:
    problems = verify.verify(sys.argv[1], subdir=True)
except verify.VerifyError as exc:
    problems, fatal = [], str(exc)
except OSError as exc:
    problems, fatal = [], "cannot read it: %s" % exc
print(json.dumps({"problems": problems, "fatal": fatal,
                  "seconds": time.monotonic() - start}))
"""

_DB_NAME = re.compile(r"\bmain/([A-Za-z_]+)")


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What a check of a store's data file found."""

    data_file: str
    size_bytes: int
    problems: tuple[str, ...]  # (none: the file is sound)
    seconds: float

    @property
    def sound(self) -> bool:
        return not self.problems

    def damaged(self) -> list[str]:
        """The databases the problems are in, and LMDB's own tables: its meta pages, its
        free list, its table of databases."""
        names = set()
        for problem in self.problems:
            found = _DB_NAME.findall(problem)
            if found:
                names.update(found)
            elif "freeDB" in problem:
                names.add("LMDB's free list")
            elif problem.startswith("main DB"):
                names.add("LMDB's table of databases")
            else:
                names.add("LMDB's meta pages")
        return sorted(names)

    def summary(self) -> str:
        """One line: the first problem and how many there are."""
        if self.sound:
            return f"{self.data_file} is sound"
        more = (
            f" ({len(self.problems)} problems, in {', '.join(self.damaged())})"
            if len(self.problems) > 1
            else ""
        )
        return f"{self.data_file} is damaged: {self.problems[0]}{more}"


def check_store(
    store_dir: str | Path, started: Callable[[subprocess.Popen[str]], None] | None = None
) -> CheckReport:
    """Walk every page of the store in ``store_dir`` (``DATA_DIR/store``) in a child
    process, and report what is damaged. A check that dies is reported as damage.
    ``started`` is given the child (a node closing kills the check it started)."""
    data_file = Path(store_dir) / "data.mdb"
    try:
        size = data_file.stat().st_size
    except OSError as exc:
        return CheckReport(str(data_file), 0, (f"cannot read it: {exc.strerror}",), 0.0)
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        if started is not None:
            started(child)
        stdout, stderr = child.communicate()
    try:
        found = json.loads(stdout)
        problems = tuple(found["problems"]) or ((found["fatal"],) if found["fatal"] else ())
        seconds = float(found["seconds"])
    except (ValueError, KeyError, TypeError):
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        problems, seconds = (f"the check stopped (exit {child.returncode}): {last}",), 0.0
    return CheckReport(str(data_file), size, problems, seconds)
