"""The peers' scenarios, the parent side: zmesh's scenarios where they map, per peer.

Each starts the peer's server (peer_servers.py) in its own directory, the consumer and
the producer as processes of their own (``{peer}_consumer``, ``{peer}_producer``), and
times them as zmesh's are timed: throughput from the producer's first timed publish to
the consumer's last ack confirmed by the server, after a warm-up that is itself acked.
Zenoh has no acks and no server: it runs the per-message and the latency scenarios.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ._child import Child, Children, children
from .peer_servers import Server, free_port, server
from .scen_zmesh import window_rate
from .sizes import Sizes

Runner = Callable[[Path, Sizes, Path | None], dict[str, Any]]
PREFIX = {"nats": "nats_js", "redis": "redis_streams", "zenoh": "zenoh_peer"}


def _url(peer: str, srv: Server | None) -> str:
    if srv is not None:
        return srv.url
    return f"tcp/127.0.0.1:{free_port()}"  # (Zenoh: where the subscriber listens)


def _consumer(kids: Children, peer: str, url: str, sizes: Sizes, **params: Any) -> Child:
    return kids.start(f"{peer}_consumer", name="consumer", url=url, batch=sizes.batch, **params)


def _producer(kids: Children, peer: str, url: str, **params: Any) -> Child:
    return kids.start(f"{peer}_producer", name="producer", url=url, **params)


def _cpu_per_msg(srv: Server | None, cpu0: float, count: int) -> dict[str, float]:
    return {} if srv is None else {"server": (srv.cpu_s() - cpu0) * 1e6 / count}


def _live(
    peer: str,
    workdir: Path,
    sizes: Sizes,
    profile: Path | None,
    *,
    api: str,
    count: int,
    rate: float = 0.0,
    warmup: int | None = None,
) -> dict[str, Any]:
    warmup = sizes.warmup if warmup is None else warmup
    deadline_s = (sizes.latency_s * 3 + 60) if rate else sizes.deadline(count, 1_000)
    with server(peer, workdir) as srv, children(workdir, profile) as kids:
        url = _url(peer, srv)
        common = {"api": api, "warmup": warmup, "deadline_s": deadline_s}
        cons = _consumer(
            kids, peer, url, sizes, expect=warmup + count, latency=bool(rate), **common
        )
        cons.expect("ready", 60)
        prod = _producer(kids, peer, url, count=count, rate=rate, batch=sizes.batch, **common)
        prod.expect("warmed", deadline_s)
        cons.expect("warm", deadline_s)
        cpu0 = srv.cpu_s() if srv else 0.0
        prod.send("go")
        sent = prod.expect("sent", deadline_s)
        done = cons.expect("done", deadline_s)
        cpu = _cpu_per_msg(srv, cpu0, count)
        got = cons.expect("result", 30)
        server_rss = {"server": srv.rss_mb()} if srv else {}
    t0 = sent["t0"]
    out: dict[str, Any] = {
        "seconds": done["t"] - t0,
        "publish_seconds": sent["t_published"] - t0,
        "rss_mb": {"producer": sent["rss_mb"], "consumer": got["rss_mb"], **server_rss},
        "cpu_us_per_msg": {
            "producer": sent["cpu_s"] * 1e6 / count,
            "consumer": got["cpu_s"] * 1e6 / count,
            **cpu,
        },
    }
    if rate:
        out["rate"] = count / (sent["t_published"] - t0)
        out.update({k: got[k] for k in ("p50_ms", "p99_ms", "max_ms", "samples")})
    else:
        out["rate"] = count / (done["t"] - t0)
    return out


def _backlog(kids: Children, peer: str, srv: Server, n: int, deadline_s: float) -> dict[str, Any]:
    """Publish ``n`` with the group declared and no consumer; the producer's ``sent``."""
    prod = _producer(
        kids, peer, srv.url, api="each", warmup=0, count=n, batch=1000, deadline_s=deadline_s
    )
    sent = prod.expect("sent", deadline_s)
    prod.stop()
    return sent


def _offline(peer: str, workdir: Path, sizes: Sizes, profile: Path | None) -> dict[str, Any]:
    """A backlog published while the group is offline; then its consumer drains it."""
    n = sizes.offline
    deadline_s = sizes.deadline(n, 1_000) + 120
    with server(peer, workdir) as srv, children(workdir, profile) as kids:
        assert srv is not None
        sent = _backlog(kids, peer, srv, n, deadline_s)
        held = {"now": srv.rss_now_mb(), "peak": srv.rss_mb()}
        cpu0 = srv.cpu_s()
        cons = _consumer(
            kids, peer, srv.url, sizes, api="each", warmup=0, expect=n, deadline_s=deadline_s
        )
        ready = cons.expect("ready", 60)
        done = cons.expect("done", deadline_s)
        cpu = _cpu_per_msg(srv, cpu0, n)
        got = cons.expect("result", 30)
        server_peak = srv.rss_mb()
    seconds = done["t"] - ready["t_subscribed"]
    return {
        "rate": n / seconds,
        "seconds": seconds,
        "publish_rate": n / (sent["t_confirmed"] - sent["t0"]),
        "server_rss_after_publish_mb": held["now"],
        "server_peak_rss_after_publish_mb": held["peak"],
        "first_message_after_reconnect_s": got["t_first"] - ready["t_subscribed"],
        "rss_mb": {"producer": sent["rss_mb"], "consumer": got["rss_mb"], "server": server_peak},
        "cpu_us_per_msg": {"consumer": got["cpu_s"] * 1e6 / n, **cpu},
    }


def _restart(peer: str, workdir: Path, sizes: Sizes, profile: Path | None) -> dict[str, Any]:
    """A backlog built, the server stopped; a consumer waits (trying every 5 ms) while the
    server starts again on the same data; the time from its start to the first message."""
    n, window_s = sizes.restart, sizes.restart_window_s
    deadline_s = sizes.deadline(n, 1_000) + 120
    with server(peer, workdir) as srv, children(workdir, profile) as kids:
        assert srv is not None
        sent = _backlog(kids, peer, srv, n, deadline_s)
        srv.stop()
        cons = _consumer(
            kids,
            peer,
            srv.url,
            sizes,
            api="each",
            warmup=0,
            expect=n,
            window_s=window_s,
            retry=True,
            deadline_s=deadline_s,
        )
        cons.expect("started", 60)  # (its client imported; it tries to connect)
        t0 = srv.start(wait=False)
        srv.wait_ready()
        t_ready = time.monotonic()
        first = cons.expect("first", 300)
        time.sleep(window_s + 0.3)
        cons.send("stop")
        got = cons.expect("result", 60)
        server_rss = srv.rss_mb()
    rate = window_rate(got, n, window_s, f"the restarted {peer} server")
    return {
        "first_message_s": first["t"] - t0,
        "server_start_s": t_ready - t0,
        "rate": rate,
        "build_publish_rate": n / (sent["t_confirmed"] - sent["t0"]),
        "rss_mb": {
            "producer_build": sent["rss_mb"],
            "consumer": got["rss_mb"],
            "server": server_rss,
        },
        "cpu_us_per_msg": {"consumer": got["cpu_s"] * 1e6 / max(1, got["count"])},
    }


def _each(peer: str, workdir: Path, sizes: Sizes, profile: Path | None) -> dict[str, Any]:
    """zmesh_process's counterpart (Zenoh's, with no acks, raw_pushpull_1's)."""
    count = sizes.raw if peer == "zenoh" else sizes.peer
    return _live(peer, workdir, sizes, profile, api="each", count=count)


def _batch(peer: str, workdir: Path, sizes: Sizes, profile: Path | None) -> dict[str, Any]:
    """zmesh_batch_process's counterpart: one ack per batch."""
    return _live(
        peer, workdir, sizes, profile, api="batch", count=sizes.peer_batch, warmup=sizes.warmup * 4
    )


def _latency(peer: str, workdir: Path, sizes: Sizes, profile: Path | None) -> dict[str, Any]:
    return _live(
        peer,
        workdir,
        sizes,
        profile,
        api="each",
        count=int(sizes.latency_s * sizes.latency_rate),
        rate=sizes.latency_rate,
        warmup=sizes.latency_warmup,
    )


KINDS: dict[str, Callable[[str, Path, Sizes, Path | None], dict[str, Any]]] = {
    "each": _each,
    "batch": _batch,
    "latency": _latency,
    "offline_backlog": _offline,
    "restart": _restart,
}
# What each peer runs: a broker all of them; Zenoh (no acks, nothing kept) two.
PEER_KINDS = {
    "nats": tuple(KINDS),
    "redis": tuple(KINDS),
    "zenoh": ("each", "latency"),
}


def scenario_name(peer: str, kind: str) -> str:
    prefix = PREFIX[peer]
    if kind == "latency":
        return f"latency_{prefix}"
    if kind == "each" and peer == "zenoh":
        return f"{prefix}_1"  # (no acks: raw_pushpull_1's counterpart)
    return f"{prefix}_{kind}"


# Scenario name -> (peer, runner(workdir, sizes, profile)).
PEER_SCENARIOS: dict[str, tuple[str, Runner]] = {
    scenario_name(peer, kind): (peer, partial(KINDS[kind], peer))
    for peer, kinds in PEER_KINDS.items()
    for kind in kinds
}
