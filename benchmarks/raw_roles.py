"""Raw pyzmq baselines, the worker side: what zmesh is measured against.

- ``raw_pull`` / ``raw_push``: PUSH/PULL, ``batch`` messages of 100 bytes per frame (1: one
  message per frame; 100: 100 payloads concatenated in one frame), optionally paced with a
  sending time in each payload for latency. With ``handoff`` they add what zmesh's contract
  puts on a message's path and nothing else (the floor of any design that keeps it): the
  publishing thread hands each payload over an inproc PAIR to the thread that owns the
  PUSH socket, which commits it to LMDB (one transaction per message, sync=False and
  metasync=False like ``process`` durability) before sending it; the thread that owns the
  PULL socket hands each frame to the application thread through a queue.
- ``raw_router`` / ``raw_dealer``: a hand-written acknowledged exchange. The DEALER sends one
  message per frame (seq + payload) with at most ``window`` unacknowledged; the ROUTER acks
  cumulatively every ``ack_every`` messages or when its queue is empty. With ``lmdb_dir`` the
  DEALER first writes each chunk of up to ``chunk`` messages to an LMDB outbox in one
  transaction (sync=False, metasync=False, like zmesh's ``process`` durability) and deletes
  acknowledged ones in one transaction per batch of acks. Given several ``endpoints`` (a
  ROUTER each), it deals each chunk to the one that owns its partition, as a shared
  group's members get keyless batches (a batch's messages share a partition, the
  ``partitions`` of a topic taken in turn), with a window for each, and settles each
  one's cumulative acks against the sequences it was sent, in order. With ``fanout`` it sends
  every message to every ROUTER instead (a group each), with a window for each, and
  deletes a message once all of them acked it. With ``batch`` above 1 a frame carries
  that many messages (the first one's seq, then their payloads: consecutive, as zmesh's
  batches say), stored as one record a frame and deleted by frame.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import zmq

from ._wio import (
    PAYLOAD_BYTES,
    Commands,
    cpu_s,
    emit,
    latency_s,
    payload,
    percentiles,
    rss_mb,
    stamped,
)

BIND = "tcp://127.0.0.1:*"
CHECK_EVERY = 1024


def _bound(sock: zmq.Socket) -> str:
    sock.bind(BIND)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def raw_pull(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 200)
    emit("ready", endpoint=_bound(sock))
    batch, warmup, count = p["batch"], p["warmup"], p["count"]
    size = p.get("payload_bytes", PAYLOAD_BYTES)
    deadline = time.monotonic() + p["deadline_s"]
    total = warmup + count
    got = 0
    lat: list[float] = []
    warm_sent = False
    cpu0 = 0.0
    try:
        with _receiver(sock, p.get("handoff", False)) as recv:
            while got < total and not cmds.stopping:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"received {got} of {total} messages before the deadline")
                for _ in range(CHECK_EVERY):
                    try:
                        frame = recv()
                    except zmq.Again:
                        break
                    if p.get("latency"):
                        if got >= warmup:
                            lat.append(latency_s(frame))
                        got += 1
                    else:
                        got += len(frame) // size if batch > 1 else 1
                    if got >= warmup and not warm_sent:
                        warm_sent = True
                        cpu0 = cpu_s()
                        emit("warm")
                    if got >= total:
                        break
        t_end = time.monotonic()
        emit(
            "done",
            t_end=t_end,
            received=got,
            rss_mb=rss_mb(),
            cpu_s=cpu_s() - cpu0,
            **percentiles(lat),
        )
        cmds.wait_stop(p["deadline_s"])
    finally:
        sock.close(linger=0)
        ctx.term()


@contextmanager
def _receiver(sock: zmq.Socket, handoff: bool) -> Iterator[Callable[[], bytes]]:
    """What the application thread receives with (zmq.Again after 0.2 s without a frame):
    the PULL socket's ``recv``, or (``handoff``) a queue a thread that owns it fills."""
    if not handoff:
        yield sock.recv
        return
    frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def own(stop: threading.Event) -> None:
        while not stop.is_set():
            with suppress(zmq.Again):
                frames.put(sock.recv())

    def handed() -> bytes:
        try:
            return frames.get(timeout=0.2)
        except queue.Empty:
            raise zmq.Again() from None

    with _owning("raw-pull-io", own):
        yield handed


@contextmanager
def _owning(name: str, loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """``loop(stop)`` on a thread of its own (the one that owns a socket) for the block;
    what it raised is raised at the block's end."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop(stop)
        except BaseException as exc:  # (re-raised on the worker's main thread)
            failed.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if failed:
            raise RuntimeError(f"thread {name} failed") from failed[0]


def raw_push(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(p["endpoint"])
    batch, warmup, count, rate = p["batch"], p["warmup"], p["count"], p.get("rate", 0)
    frame = payload(0, p.get("payload_bytes", PAYLOAD_BYTES)) * batch
    deadline = time.monotonic() + p["deadline_s"]
    try:
        with _sender(ctx, sock, p.get("lmdb_dir")) as out:
            _push(out, frame, warmup // batch, rate, deadline)
            emit("warmed")
            cmds.wait("go", p["deadline_s"])
            t0, cpu0 = time.monotonic(), cpu_s()
            _push(out, frame, count // batch, rate, deadline)
            emit("sent", t0=t0, t_sent=time.monotonic(), rss_mb=rss_mb(), cpu_s=cpu_s() - cpu0)
            cmds.wait_stop(p["deadline_s"])
    finally:
        sock.close()
        ctx.term()


@contextmanager
def _sender(ctx: zmq.Context, sock: zmq.Socket, lmdb_dir: str | None) -> Iterator[zmq.Socket]:
    """The socket the publishing thread sends on: the PUSH socket itself, or (``lmdb_dir``)
    an inproc PAIR to a thread that owns it and commits each message before sending it."""
    if lmdb_dir is None:
        yield sock
        return
    import lmdb

    env = lmdb.open(lmdb_dir, map_size=1 << 30, sync=False, metasync=False, readahead=False)
    rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    rx.bind("inproc://raw-push-io")
    tx.connect("inproc://raw-push-io")
    rx.setsockopt(zmq.RCVTIMEO, 200)
    tx.setsockopt(zmq.SNDTIMEO, 5000)  # (a sending thread that died: zmq.Again, not a hang)

    def own(stop: threading.Event) -> None:
        seq = 0
        while not stop.is_set():
            try:
                data = rx.recv()
            except zmq.Again:
                continue
            with env.begin(write=True) as txn:
                txn.put(seq.to_bytes(8, "big"), data, append=True)
            seq += 1
            sock.send(data)

    try:
        with _owning("raw-push-io", own):
            yield tx
    finally:
        tx.close(linger=0)
        rx.close(linger=0)
        env.close()


def _push(sock: zmq.Socket, frame: bytes, frames: int, rate: float, deadline: float) -> None:
    send = sock.send
    if rate:
        interval = 1.0 / rate
        t_next = time.monotonic()
        for _ in range(frames):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError("paced sending ran past its deadline")
            if t_next > now:
                time.sleep(t_next - now)
            send(stamped())
            t_next += interval
        return
    done = 0
    while done < frames:
        if time.monotonic() > deadline:
            raise TimeoutError(f"sent {done} of {frames} frames before the deadline")
        n = min(CHECK_EVERY, frames - done)
        for _ in range(n):
            send(frame)
        done += n


def raw_router(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    emit("ready", endpoint=_bound(sock))
    ack_every, warmup = p["ack_every"], p.get("warmup", 0)
    batch = p.get("batch", 1)  # (messages a frame carries)
    deadline = time.monotonic() + p["deadline_s"]
    received = 0
    cpu0, counted_from = cpu_s(), 0  # (CPU of the timed part: from the warm-up's end)
    recv = sock.recv_multipart
    send = sock.send_multipart
    try:
        while not cmds.stopping and time.monotonic() < deadline:
            if not sock.poll(100):
                continue
            ident = None
            pending = 0
            for _ in range(CHECK_EVERY):
                try:
                    ident, _frame = recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += batch
                pending += batch
                if pending >= ack_every:
                    send([ident, received.to_bytes(8, "big")])
                    pending = 0
            if pending and ident is not None:
                send([ident, received.to_bytes(8, "big")])
            if not counted_from and warmup and received >= warmup:
                cpu0, counted_from = cpu_s(), received
        emit("result", received=received - counted_from, rss_mb=rss_mb(), cpu_s=cpu_s() - cpu0)
    finally:
        sock.close(linger=0)
        ctx.term()


def raw_dealer(p: dict[str, Any], cmds: Commands) -> None:
    ctx = zmq.Context()
    socks = []
    for endpoint in p["endpoints"]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
    env = None
    if p.get("lmdb_dir"):
        import lmdb

        env = lmdb.open(
            p["lmdb_dir"], map_size=1 << 30, sync=False, metasync=False, readahead=False
        )
    args = (
        socks,
        env,
        p["window"],
        p["chunk"],
        time.monotonic() + p["deadline_s"],
        payload(0, p.get("payload_bytes", PAYLOAD_BYTES)),
        p.get("batch", 1),
    )
    dealt = len(socks) > 1 and not p.get("fanout")
    ex = _Dealt(p["partitions"], *args) if dealt else _Exchange(*args)
    try:
        ex.run(p["warmup"])
        t0, cpu0 = time.monotonic(), cpu_s()
        ex.run(p["count"])
        t1 = time.monotonic()
        emit("result", t0=t0, t1=t1, rss_mb=rss_mb(), cpu_s=cpu_s() - cpu0)
        cmds.wait_stop(p["deadline_s"])
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
        if env is not None:
            env.close()


def _store(env: Any, seqs: range, body: bytes) -> None:
    """Write ``seqs`` to the LMDB outbox in one transaction (None: no outbox)."""
    if env is not None:
        with env.begin(write=True) as txn:
            txn.cursor().putmulti([(s.to_bytes(8, "big"), body) for s in seqs], append=True)


def _store_frame(env: Any, first: int, frame: bytes) -> None:
    """Write a frame of messages to the LMDB outbox as one record (None: no outbox)."""
    if env is not None:
        with env.begin(write=True) as txn:
            txn.put(first.to_bytes(8, "big"), frame, append=True)


def _settle(env: Any, seqs: Iterable[int]) -> None:
    """Delete acknowledged ``seqs`` (or frames, by their first) from the LMDB outbox in
    one transaction."""
    if env is not None:
        with env.begin(write=True) as txn:
            delete = txn.delete
            for s in seqs:
                delete(s.to_bytes(8, "big"))


def _acked(sock: zmq.Socket, acked: int) -> int:
    """The highest cumulative ack waiting on ``sock`` (``acked`` when none is)."""
    while True:
        try:
            acked = max(acked, int.from_bytes(sock.recv(zmq.NOBLOCK), "big"))
        except zmq.Again:
            return acked


class _Exchange:
    """The DEALER's side: a send window, cumulative acks, and an optional LMDB outbox.
    Over several ROUTERs (fanned out, a group each) every message goes to each, with a
    window each, and is deleted once all of them acked it."""

    def __init__(
        self,
        socks: list[zmq.Socket],
        env: Any,
        window: int,
        chunk: int,
        deadline: float,
        body: bytes,
        batch: int = 1,
    ) -> None:
        if chunk % batch or window % batch:
            raise ValueError(f"chunk {chunk} and window {window} must be frames of {batch}")
        self.socks, self.env = socks, env
        self.window, self.chunk, self.deadline = window, chunk, deadline
        self.body = body
        self.batch = batch
        self.seq = 0
        self.settled = 0  # (what every ROUTER acked)
        self.acked = [0] * len(socks)  # each ROUTER's cumulative ack
        self.poller = zmq.Poller()
        for sock in socks:
            self.poller.register(sock, zmq.POLLIN)

    def run(self, n: int) -> None:
        env, body, batch, acked = self.env, self.body, self.batch, self.acked
        if n % batch:
            raise ValueError(f"{n} messages are not frames of {batch}")
        sends = [sock.send for sock in self.socks]
        bodies = body * batch  # (a frame's payloads)
        target = self.seq + n
        while self.settled < target:
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{self.settled} of {target} acked before the deadline")
            # (the fullest window: the ROUTER furthest behind)
            room = min(self.window - (self.seq - self.settled), target - self.seq)
            while room > 0:
                k = min(room, self.chunk)
                seqs = range(self.seq, self.seq + k)
                if batch > 1:
                    for first in range(seqs.start, seqs.stop, batch):
                        frame = first.to_bytes(8, "big") + bodies
                        _store_frame(env, first, frame)
                        for send in sends:
                            send(frame)
                elif len(sends) == 1:  # (one ROUTER: no loop over them per message)
                    _store(env, seqs, body)
                    send = sends[0]
                    for s in seqs:
                        send(s.to_bytes(8, "big") + body)
                else:
                    _store(env, seqs, body)
                    for s in seqs:
                        frame = s.to_bytes(8, "big") + body
                        for send in sends:
                            send(frame)
                self.seq += k
                room -= k
            ready = dict(self.poller.poll(100))
            for i, sock in enumerate(self.socks):
                if sock in ready:
                    acked[i] = _acked(sock, acked[i])
            new = min(acked)
            if new > self.settled:
                _settle(env, range(self.settled, new, batch))
                self.settled = new


class _Dealt(_Exchange):
    """``_Exchange`` over several ROUTERs: each chunk (a keyless batch, its messages in one
    partition, the partitions in turn) to the one owning its partition, a window each, and
    each one's cumulative acks (the count it received) settling the sequences it was sent,
    in the order sent."""

    def __init__(self, partitions: int, socks: list[zmq.Socket], *args: Any) -> None:
        super().__init__(socks, *args)
        self.owner = [p % len(socks) for p in range(partitions)]
        self.turn = 0  # the next chunk's partition
        self.sent: list[list[int]] = [[] for _ in socks]  # each one's, unacked, in order

    def run(self, n: int) -> None:
        env, body, owner, sent = self.env, self.body, self.owner, self.sent
        sends = [sock.send for sock in self.socks]
        appends = [each.append for each in sent]
        target = self.seq + n
        while self.settled < target:
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{self.settled} of {target} acked before the deadline")
            # (each chunk to the next partition's owner: room for a chunk to the fullest)
            room = min(self.window - max(map(len, sent)), target - self.seq)
            while room > 0:
                k = min(room, self.chunk)
                seqs = range(self.seq, self.seq + k)
                _store(env, seqs, body)
                to = owner[self.turn]
                self.turn = (self.turn + 1) % len(owner)
                send, append = sends[to], appends[to]
                for s in seqs:
                    send(s.to_bytes(8, "big") + body)
                    append(s)
                self.seq += k
                room -= k
            ready = dict(self.poller.poll(100))
            for i, sock in enumerate(self.socks):
                if sock not in ready:
                    continue
                new = _acked(sock, self.acked[i])
                done = new - self.acked[i]
                if done > 0:
                    _settle(env, sent[i][:done])
                    del sent[i][:done]
                    self.acked[i] = new
                    self.settled += done


ROLES = {
    "raw_pull": raw_pull,
    "raw_push": raw_push,
    "raw_router": raw_router,
    "raw_dealer": raw_dealer,
}
