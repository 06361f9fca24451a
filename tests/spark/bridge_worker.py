"""A bridge in a process of its own, for tests that kill it: prints READY, then serves.

python tests/spark/bridge_worker.py MESH DATA_DIR LOG_DIR TOPIC SEED
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import zmesh
import zmesh.spark


def main() -> None:
    mesh, data_dir, log_dir, topic, seed = sys.argv[1:6]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (
        zmesh.Node(
            "bridge",
            mesh=mesh,
            data_dir=data_dir,
            interfaces=["127.0.0.1"],
            mdns=False,
            seeds=[seed],
            heartbeat_interval_s=0.2,
            dead_after_s=1.5,
        ) as node,
        zmesh.spark.Bridge(node, topics=[topic], log_dir=log_dir) as bridge,
    ):
        print(f"READY {node.control_address} {bridge.endpoint}", flush=True)
        stop.wait(600)
        print(f"STATS {json.dumps(bridge.stats())}", flush=True)


if __name__ == "__main__":
    main()
