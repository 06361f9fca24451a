"""Child process of the transaction kill test: source, transformer or sink.

SIGTERM stops each cleanly (exit 0): the source once every message of A is acked, the
transformer once its outbox is empty (every message of B acked by the sink), the sink after
the batch it is writing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import zmesh
from tests.waiting import until

COMMON = dict(
    mesh=os.environ["ZMESH_TEST_MESH"],
    interfaces=["127.0.0.1"],
    mdns=False,
    heartbeat_interval_s=0.2,
    dead_after_s=1.5,
)
DRAIN_TIMEOUT_S = 120.0


def main() -> int:
    role, data_dir, path = sys.argv[1], sys.argv[2], sys.argv[3]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if role == "source":
        count = int(sys.argv[4])
        node = zmesh.Node(
            "source", data_dir=data_dir, topics={"a": zmesh.TopicConfig(groups=("xf",))}, **COMMON
        ).start()
        with open(path + ".tmp", "w") as f:
            f.write(node.control_address)
        os.replace(path + ".tmp", path)
        receipts = [node.publish("a", str(i).encode()) for i in range(count)]
        deadline = time.monotonic() + 240
        for r in receipts:
            r.wait_acked(max(0.1, deadline - time.monotonic()))
        stop.wait(240)
        node.close()
        return 0
    seed = Path(sys.argv[4]).read_text()
    if role == "transformer":
        node = zmesh.Node(
            "transformer",
            data_dir=data_dir,
            seeds=[seed],
            topics={"b": zmesh.TopicConfig(groups=("sink",))},
            **COMMON,
        ).start()
        sub = node.subscribe("a", group="xf", max_in_flight=50, batch_size=10)
        while not stop.is_set():
            msg = sub.get(timeout=0.1)
            if msg is None:
                continue
            with node.transaction() as tx:
                tx.publish("b", msg.payload)
                tx.ack(msg)
        # Stopped: exit 0 only once every message of B this data dir holds (its earlier,
        # killed runs' too) is acked by the sink, so none can be redelivered later.
        if not until(lambda: node.status()["outbox"] == 0, DRAIN_TIMEOUT_S, 0.05):
            print(
                f"outbox still holds {node.status()['outbox']} after {DRAIN_TIMEOUT_S:g}s",
                flush=True,
            )
            node.close()
            return 3
        node.close()
        return 0
    if role == "sink":
        node = zmesh.Node("sink", data_dir=data_dir, seeds=[seed], **COMMON).start()
        sub = node.subscribe("b", group="sink")
        with open(path, "a") as log:
            while not stop.is_set():
                msgs = sub.fetch(500, timeout=0.1)
                if not msgs:
                    continue
                log.write("".join(m.payload.decode() + "\n" for m in msgs))
                log.flush()
                os.fsync(log.fileno())
                for m in msgs:
                    m.ack()
        node.close()
        return 0
    raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    sys.exit(main())
