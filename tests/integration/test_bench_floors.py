"""The benchmark suite's hand-written LMDB outbox senders keep the contract they are the
floor of: a message leaves the outbox only once acknowledged (fanned out: by every
consumer), and a frame of a batch is one record. Real sockets on loopback, a real LMDB."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
import zmq

from benchmarks.raw_roles import _Exchange

BODY = b"x" * 10


def _ack(router: zmq.Socket, limit: int, stop: threading.Event) -> None:
    """Ack what arrives cumulatively (a frame: its seq, then payloads) up to ``limit``
    messages, until ``stop``."""
    received = 0
    try:
        while not stop.is_set():
            if not router.poll(20):
                continue
            ident, frame = router.recv_multipart()
            received += (len(frame) - 8) // len(BODY)
            if received <= limit:
                router.send_multipart([ident, received.to_bytes(8, "big")])
    finally:
        router.close(linger=0)


@contextmanager
def _consumers(limits: list[int]) -> Iterator[list[zmq.Socket]]:
    """A DEALER connected to a ROUTER (on a thread of its own) for each of ``limits``:
    the messages that ROUTER acks at most."""
    ctx = zmq.Context()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    dealers: list[zmq.Socket] = []
    try:
        for limit in limits:
            router = ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            thread = threading.Thread(target=_ack, args=(router, limit, stop), name="floor-router")
            thread.start()
            threads.append(thread)
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealers.append(dealer)
        yield dealers
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for dealer in dealers:
            dealer.close(linger=0)
        ctx.term()


def _outbox(tmp_path: Path) -> lmdb.Environment:
    return lmdb.open(str(tmp_path / "outbox"), map_size=1 << 26, sync=False, metasync=False)


def _records(env: lmdb.Environment) -> dict[int, bytes]:
    with env.begin() as txn:
        return {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor()}


@pytest.mark.timeout(60)
def test_fanned_out_a_message_leaves_the_outbox_once_every_consumer_acked_it(
    tmp_path: Path,
) -> None:
    env = _outbox(tmp_path)
    try:
        # The second consumer acks its first 20 messages only: the sender stops at a
        # window (50) past them, and times out.
        with _consumers([1_000, 20]) as dealers:
            ex = _Exchange(dealers, env, 50, 10, time.monotonic() + 3.0, BODY)
            with pytest.raises(TimeoutError, match="20 of 100 acked"):
                ex.run(100)
        kept = _records(env)
    finally:
        env.close()
    assert ex.seq == 70 and ex.acked == [70, 20]
    # Acked by the first consumer, not by the second: still in the outbox.
    assert sorted(kept) == list(range(20, 70))
    assert all(v == BODY for v in kept.values())


@pytest.mark.timeout(60)
def test_a_frame_of_a_batch_is_one_record_deleted_once_acked(tmp_path: Path) -> None:
    env = _outbox(tmp_path)
    try:
        # Frames of 10, a window of 30 messages; the consumer acks 20, then nothing.
        with _consumers([20]) as dealers:
            ex = _Exchange(dealers, env, 30, 10, time.monotonic() + 3.0, BODY, 10)
            with pytest.raises(TimeoutError, match="20 of 100 acked"):
                ex.run(100)
        kept = _records(env)
    finally:
        env.close()
    assert ex.seq == 50
    assert kept == {first: first.to_bytes(8, "big") + BODY * 10 for first in (20, 30, 40)}


def test_a_batch_that_is_not_whole_frames_is_refused() -> None:
    with pytest.raises(ValueError, match="must be frames of 10"):
        _Exchange([], None, 35, 10, time.monotonic() + 3.0, BODY, 10)
    ex = _Exchange([], None, 30, 10, time.monotonic() + 3.0, BODY, 10)
    with pytest.raises(ValueError, match="25 messages are not frames of 10"):
        ex.run(25)
