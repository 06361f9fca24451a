"""What the peers' workers share: the consumer's tally, pacing, and retrying a connection.

Every peer's consumer reports the same events as zmesh's: ``first`` (its first message),
``warm`` (the warm-up acked), ``done`` (the expected count acked and the acks confirmed
by the server) and ``result`` when it stops; its producer ``ready``, ``warmed`` and
``sent``. The parent (scen_peers.py) times them alike for every peer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ._wio import Commands, cpu_s, emit, latency_s, percentiles, rss_mb

RETRY_S = 0.005  # a consumer waiting for a restarting server tries again this often
T = TypeVar("T")


class Tally:
    """A consumer's count: messages taken (latency from their stamps), then acked."""

    def __init__(self, p: dict[str, Any]) -> None:
        self.expect: int = p.get("expect", 0)
        self.warmup: int = p.get("warmup", 0)
        self.latency: bool = p.get("latency", False)
        self.window_s: float = p.get("window_s", 0.0)
        self.taken = self.count = self.window_count = 0
        self.t_first = self.t_last = 0.0
        self.lat: list[float] = []
        self.cpu0, self.cpu = cpu_s(), 0.0

    @property
    def finished(self) -> bool:
        return bool(self.expect) and self.count >= self.expect

    def wanted(self, batch: int) -> int:
        """How many to ask for: a batch, or what is left of the expected count."""
        return min(batch, self.expect - self.count) if self.expect else batch

    def took(self, payloads: Iterable[bytes]) -> None:
        """Messages in the application's hands (before their acks)."""
        if not self.t_first:
            self.t_first = time.monotonic()
            emit("first", t=self.t_first)
        if not self.latency:
            return
        for data in payloads:
            if self.taken >= self.warmup:  # (the warm-up's latencies are left out)
                self.lat.append(latency_s(data))
            self.taken += 1

    def confirms(self, n: int) -> bool:
        """Acking ``n`` more reaches the end of the warm-up or of the run: the caller
        confirms the acks reached the server before ``acked`` times them."""
        after = self.count + n
        return (self.count < self.warmup <= after) or (0 < self.expect <= after)

    def acked(self, n: int) -> None:
        before = self.count
        self.count = after = before + n
        now = time.monotonic()
        if before < self.warmup <= after:
            self.cpu0 = cpu_s()
            emit("warm", t=now)
        if self.window_s and not self.window_count and now >= self.t_first + self.window_s:
            self.window_count = after
        if self.expect and before < self.expect <= after:
            self.t_last = now
            self.cpu = cpu_s() - self.cpu0
            emit("done", t=now)

    def result(self, **extra: Any) -> None:
        emit(
            "result",
            count=self.count,
            t_first=self.t_first,
            t_last=self.t_last,
            window_count=self.window_count,
            rss_mb=rss_mb(),
            cpu_s=self.cpu or cpu_s() - self.cpu0,
            **percentiles(self.lat),
            **extra,
        )


def produce(p: dict[str, Any], cmds: Commands, publish: Callable[[int], None]) -> None:
    """A producer's run (``publish(n)`` sends n): the warm-up, then at ``go`` the timed
    part, reported as ``sent``; then it waits to be stopped."""
    if p["warmup"]:
        publish(p["warmup"])
        emit("warmed")
        cmds.wait("go", p["deadline_s"])
    t0, cpu0 = time.monotonic(), cpu_s()
    publish(p["count"])
    t_published = time.monotonic()
    emit(
        "sent",
        t0=t0,
        t_published=t_published,
        t_confirmed=t_published,  # (each publish returned once the peer had it)
        rss_mb=rss_mb(),
        cpu_s=cpu_s() - cpu0,
    )
    cmds.wait_stop(p["deadline_s"])


def check(cmds: Commands, deadline: float, what: str) -> None:
    """Stop when asked; fail past the deadline (every loop of a worker calls this)."""
    cmds.check()
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what} ran past its deadline")


def retrying(
    attempt: Callable[[], T], retry: bool, deadline: float, cmds: Commands, what: str
) -> T:
    """``attempt()``; with ``retry``, again every few milliseconds while it raises (a
    server that is starting), until the deadline."""
    while True:
        try:
            return attempt()
        except Exception:
            if not retry:
                raise
        check(cmds, deadline, what)
        time.sleep(RETRY_S)


def pace(rate: float) -> Callable[[], float]:
    """For a paced loop: each call returns how long to sleep before the next send."""
    interval, t_next = 1.0 / rate, [time.monotonic()]

    def wait() -> float:
        delay = t_next[0] - time.monotonic()
        t_next[0] += interval
        return max(0.0, delay)

    return wait
