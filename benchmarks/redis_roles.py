"""Redis Streams, the worker side (redis-py with hiredis): what a user would write instead.

One stream and one consumer group made with ``XGROUP CREATE ... 0 MKSTREAM`` by whichever
role starts first (the group exists before anything is published).

- ``redis_producer``: ``XADD`` per message, sent in pipelines of ``batch`` commands (one
  round trip each, the client's way to not wait per message); paced (latency) runs send
  each on its own. Every reply is read: the entry is in the server.
- ``redis_consumer``: ``XREADGROUP ... COUNT batch BLOCK`` (it returns as soon as entries
  exist), then ``XACK`` per message, the batch's acks in one pipeline (``api`` "each"), or
  one ``XACK`` of every id of the batch (``api`` "batch"). Acked entries stay in the stream:
  Redis 7 has no ack that deletes, and trimming is the application's business.
"""

from __future__ import annotations

import time
from typing import Any

from ._peerio import Tally, check, pace, produce, retrying
from ._wio import Commands, emit, payload, stamped

KEY, GROUP, FIELD = "bench", "g", b"d"
BLOCK_MS = 500  # a read that finds nothing returns to check for a stop


def _client(p: dict[str, Any], cmds: Commands, deadline: float) -> Any:
    """A connection that answered PING (not loading its append-only file any more), and
    the group declared."""
    import redis

    r = redis.Redis(host="127.0.0.1", port=int(p["url"]), socket_connect_timeout=1)

    def attempt() -> None:
        r.ping()
        try:
            r.xgroup_create(KEY, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    retrying(attempt, p.get("retry", False), deadline, cmds, "reaching the Redis server")
    return r


def _publish(r: Any, p: dict[str, Any], count: int, deadline: float, cmds: Commands) -> None:
    rate = p.get("rate", 0.0)
    if rate:
        wait = pace(rate)
        for _ in range(count):
            check(cmds, deadline, "paced publishing")
            time.sleep(wait())
            r.xadd(KEY, {FIELD: stamped()})
        return
    body, batch = payload(), p["batch"]
    pipe = r.pipeline(transaction=False)
    done = 0
    while done < count:
        check(cmds, deadline, "publishing")
        n = min(batch, count - done)
        for _ in range(n):
            pipe.xadd(KEY, {FIELD: body})
        pipe.execute()
        done += n


def redis_producer(p: dict[str, Any], cmds: Commands) -> None:
    deadline = time.monotonic() + p["deadline_s"]
    r = _client(p, cmds, deadline)
    try:
        emit("ready")
        produce(p, cmds, lambda n: _publish(r, p, n, deadline, cmds))
    finally:
        r.close()


def redis_consumer(p: dict[str, Any], cmds: Commands) -> None:
    import redis  # noqa: F401 - imported before "started" (a restart is timed from there)

    t_start = time.monotonic()
    deadline = t_start + p["deadline_s"]
    emit("started", t=t_start)
    r = _client(p, cmds, deadline)
    try:
        emit("ready", t_subscribed=time.monotonic())
        tally = Tally(p)
        each = p["api"] != "batch"
        pipe = r.pipeline(transaction=False)
        while not tally.finished and not cmds.stopping:
            check(cmds, deadline, "consuming")
            got = r.xreadgroup(GROUP, "c1", {KEY: ">"}, count=p["batch"], block=BLOCK_MS)
            if not got:
                continue
            entries = got[0][1]
            tally.took(fields[FIELD] for _id, fields in entries)
            if each:
                for entry_id, _fields in entries:
                    pipe.xack(KEY, GROUP, entry_id)
                pipe.execute()
            else:
                r.xack(KEY, GROUP, *(entry_id for entry_id, _fields in entries))
            tally.acked(len(entries))  # (each reply read: the acks are in the server)
        tally.result(start_s=time.monotonic() - t_start)
        cmds.wait_stop(p["deadline_s"])
    finally:
        r.close()


ROLES = {"redis_producer": redis_producer, "redis_consumer": redis_consumer}
