"""What the damage check of a store costs: the walk a node makes before it opens a store
it was not closed cleanly (zmesh/_store/check.py), and ``zmesh store salvage``.

    python -m benchmarks.store_check [--gib 1.0] [--shape runs|alone]
                                     [--payload-bytes 100] [--dir DIR]

Builds a real node's store of about ``--gib`` GiB (``runs``: plain publishes, stored as
run records of up to 512 messages; ``alone``: publishes with a priority, each its own
record and pending entry: with small payloads, the most entries per byte), then times
``check_store`` (in its child process, as at a start) and a salvage into a new data dir.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import zmesh
from zmesh._store.check import check_store
from zmesh._store.salvage import salvage

BATCH = 1000


def build(data_dir: Path, gib: float, shape: str, size: int) -> tuple[int, float]:
    """Publish until the store's file holds ``gib`` GiB; (messages, seconds)."""
    payload = b"x" * size
    data = data_dir / "store" / "data.mdb"
    start = time.monotonic()
    count = 0
    with zmesh.Node(
        "bench",
        mesh="store-check",
        data_dir=str(data_dir),
        mdns=False,
        interfaces=["127.0.0.1"],
        map_size_bytes=int(gib * 3 * (1 << 30)),
        max_outbox_messages=100_000_000,
        topics={"t": zmesh.TopicConfig(groups=("g",))},
    ) as node:
        while not data.exists() or data.stat().st_size < gib * (1 << 30):
            if shape == "runs":
                r = node.publish_many("t", [payload] * BATCH)
            else:
                for _ in range(BATCH - 1):
                    node.publish("t", payload, priority=1)
                r = node.publish("t", payload, priority=1)
            count += BATCH
            if count % (BATCH * 100) == 0:
                r.wait_stored(60)
        r.wait_stored(60)
    return count, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.store_check")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--shape", choices=("runs", "alone"), default="alone")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--dir", help="where to build the store (default: a temporary dir)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="zmesh-store-check-"))
    try:
        data_dir = root / "node"
        count, built = build(data_dir, args.gib, args.shape, args.payload_bytes)
        size = (data_dir / "store" / "data.mdb").stat().st_size
        print(
            f"store: {size / (1 << 30):.2f} GiB, {count:,} messages of "
            f"{args.payload_bytes} bytes ({args.shape}), built in {built:.0f}s"
        )
        start = time.monotonic()
        report = check_store(data_dir / "store")
        took = time.monotonic() - start
        assert report.sound, report.problems[:5]
        print(
            f"check: {took:.1f}s in all ({report.seconds:.1f}s walking), "
            f"{took / (size / (1 << 30)):.1f}s per GiB"
        )
        start = time.monotonic()
        copied = salvage(data_dir, root / "salvaged")
        took = time.monotonic() - start
        print(f"salvage: {took:.1f}s, {sum(copied.copied.values()):,} records copied")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
