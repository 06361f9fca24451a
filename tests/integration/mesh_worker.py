"""A child process of the subject, request/reply and last-value tests: one node that
does what the test writes on its stdin, one command per line, answering one line each.

    python -m tests.integration.mesh_worker --mesh M --data-dir D --name N [--seed A ...]
        [--keep-last PATTERN=N ...]

It binds 127.0.0.1 with mDNS off and prints ``addr HOST:PORT`` once started. Commands:

- ``pub TOPIC COUNT [KEYS]``: publish COUNT messages ``NAME:TOPIC:i`` (key ``k{i % KEYS}``
  when KEYS is given), print ``published``;
- ``drained SECONDS``: wait until the outbox is empty, print ``drained`` (or ``owed N``);
- ``outbox``: print ``outbox N``;
- ``peers``: print the JSON list of live peers' names and subscriptions;
- ``patterns``: print the JSON list of the pattern groups this producer knows;
- ``serve TOPIC GROUP``: answer requests on TOPIC in GROUP with ``NAME:<payload>``, print
  ``serving``;
- ``stream ROUNDS PAUSE KEYS TOPIC...``: on a thread, ROUNDS times publish to every TOPIC a
  message of every key ``k0``.. (payload ``NAME:TOPIC:KEY:N``, N counting per topic and
  key from 0, on from the last stream), pausing PAUSE seconds between rounds; print
  ``streaming``;
- ``streamed``: wait for the stream to end, print ``streamed N`` (messages in all);
- ``quit``: close the node and exit 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading

import zmesh
from tests.waiting import pause, until


def answer(name: str, msg: zmesh.Message) -> bytes:
    """A responder's answer: its name and the request."""
    return f"{name}:".encode() + msg.payload


class Stream:
    """Keyed messages published on a thread, each key's counter going on across streams."""

    def __init__(self, node: zmesh.Node, name: str) -> None:
        self.node = node
        self.name = name
        self.counters: dict[tuple[str, str], int] = {}
        self.sent = 0
        self.thread: threading.Thread | None = None

    def start(self, rounds: int, pause_s: float, keys: int, topics: list[str]) -> None:
        self.thread = threading.Thread(
            target=self._run, args=(rounds, pause_s, keys, topics), name="zmesh-test-stream"
        )
        self.thread.start()

    def _run(self, rounds: int, pause_s: float, keys: int, topics: list[str]) -> None:
        for _ in range(rounds):
            for topic in topics:
                for k in range(keys):
                    key = f"k{k}"
                    n = self.counters.get((topic, key), 0)
                    self.counters[(topic, key)] = n + 1
                    payload = f"{self.name}:{topic}:{key}:{n}".encode()
                    self.node.publish(topic, payload, key=key)
                    self.sent += 1
            pause(pause_s)

    def wait(self) -> int:
        if self.thread is not None:
            self.thread.join()
        return self.sent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", action="append", default=[])
    parser.add_argument("--keep-last", action="append", default=[])
    args = parser.parse_args()
    topics = {
        pattern: zmesh.TopicConfig(keep_last=int(n))
        for pattern, n in (item.split("=") for item in args.keep_last)
    }
    node = zmesh.Node(
        config=zmesh.NodeConfig(
            name=args.name,
            mesh=args.mesh,
            data_dir=args.data_dir,
            interfaces=("127.0.0.1",),
            mdns=False,
            seeds=tuple(args.seed),
            heartbeat_interval_s=0.2,
            dead_after_s=1.5,
            topics=topics,
        )
    ).start()
    print("addr", node.control_address, flush=True)
    stream = Stream(node, args.name)
    try:
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "pub":
                topic, count = rest[0], int(rest[1])
                keys = int(rest[2]) if len(rest) > 2 else 0
                for i in range(count):
                    node.publish(
                        topic,
                        f"{args.name}:{topic}:{i}".encode(),
                        key=f"k{i % keys}" if keys else None,
                    )
                print("published", flush=True)
            elif cmd == "drained":
                empty = until(lambda: node.status()["outbox"] == 0, float(rest[0]))
                print("drained" if empty else f"owed {node.status()['outbox']}", flush=True)
            elif cmd == "outbox":
                print("outbox", node.status()["outbox"], flush=True)
            elif cmd == "peers":
                peers = [
                    {"name": p["name"], "subscriptions": p["subscriptions"]}
                    for p in node.peers()
                    if p["alive"]
                ]
                print(json.dumps(peers), flush=True)
            elif cmd == "patterns":
                print(json.dumps(node.status()["pattern_groups"]), flush=True)
            elif cmd == "serve":
                node.serve(rest[0], rest[1], functools.partial(answer, args.name))
                print("serving", flush=True)
            elif cmd == "stream":
                stream.start(int(rest[0]), float(rest[1]), int(rest[2]), rest[3:])
                print("streaming", flush=True)
            elif cmd == "streamed":
                print("streamed", stream.wait(), flush=True)
            elif cmd == "quit":
                break
    finally:
        stream.wait()
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
