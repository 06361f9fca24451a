"""Raw pyzmq baselines, the parent side: start the two processes, time one repetition.

Each function runs one repetition and returns its metrics: ``rate`` (messages per second
over the timed part, after a warm-up), ``rss_mb`` per process, and what else it measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zmesh.config import TopicConfig

from ._child import children
from ._wio import PAYLOAD_BYTES
from .sizes import Sizes


def _pushpull(
    workdir: Path,
    profile: Path | None,
    *,
    batch: int,
    warmup: int,
    count: int,
    rate: float = 0.0,
    deadline_s: float,
    contract: bool = False,
    payload_bytes: int = PAYLOAD_BYTES,
) -> dict[str, Any]:
    """``contract``: with the hand-offs and the commit zmesh's contract puts on the path
    (raw_roles.py)."""
    latency = bool(rate)
    lmdb_dir = str(workdir / "raw-contract-outbox") if contract else None
    with children(workdir, profile) as kids:
        pull = kids.start(
            "raw_pull",
            name="raw-pull",
            batch=batch,
            warmup=warmup,
            count=count,
            latency=latency,
            handoff=contract,
            deadline_s=deadline_s,
            payload_bytes=payload_bytes,
        )
        endpoint = pull.expect("ready", 15)["endpoint"]
        push = kids.start(
            "raw_push",
            name="raw-push",
            endpoint=endpoint,
            batch=batch,
            warmup=warmup,
            count=count,
            rate=rate,
            lmdb_dir=lmdb_dir,
            deadline_s=deadline_s,
            payload_bytes=payload_bytes,
        )
        push.expect("warmed", deadline_s)
        pull.expect("warm", deadline_s)
        push.send("go")
        sent = push.expect("sent", deadline_s)
        done = pull.expect("done", deadline_s)
    out: dict[str, Any] = {
        "rss_mb": {"producer": sent["rss_mb"], "consumer": done["rss_mb"]},
        "seconds": done["t_end"] - sent["t0"],
        "cpu_us_per_msg": {
            "producer": sent["cpu_s"] * 1e6 / count,
            "consumer": done["cpu_s"] * 1e6 / count,
        },
    }
    if latency:
        out["rate"] = count / (sent["t_sent"] - sent["t0"])
        out.update({k: done[k] for k in ("p50_ms", "p99_ms", "max_ms", "samples")})
    else:
        out["rate"] = count / (done["t_end"] - sent["t0"])
    out["mb_per_s"] = out["rate"] * payload_bytes / 1e6
    return out


def raw_pushpull_1(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    n = sizes.raw
    return _pushpull(
        workdir, profile, batch=1, warmup=n // 10, count=n, deadline_s=sizes.deadline(n, 100_000)
    )


def raw_pushpull_100(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    n = sizes.raw_batched
    return _pushpull(
        workdir, profile, batch=100, warmup=n // 10, count=n, deadline_s=sizes.deadline(n, 500_000)
    )


def raw_pushpull_16k(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """One 16 KiB message per frame: the baseline of ``zmesh_16k``."""
    return _large(workdir, sizes, profile, 16 << 10, sizes.large_16k)


def raw_pushpull_256k(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """One 256 KiB message per frame: the baseline of ``zmesh_256k``."""
    return _large(workdir, sizes, profile, 256 << 10, sizes.large_256k)


def _large(
    workdir: Path, sizes: Sizes, profile: Path | None, payload_bytes: int, n: int
) -> dict[str, Any]:
    return _pushpull(
        workdir,
        profile,
        batch=1,
        warmup=n // 10,
        count=n,
        deadline_s=sizes.deadline(n, 200),
        payload_bytes=payload_bytes,
    )


def latency_raw(
    workdir: Path, sizes: Sizes, profile: Path | None = None, contract: bool = False
) -> dict[str, Any]:
    n = int(sizes.latency_s * sizes.latency_rate)
    return _pushpull(
        workdir,
        profile,
        batch=1,
        warmup=sizes.latency_warmup,
        count=n,
        rate=sizes.latency_rate,
        deadline_s=sizes.latency_s * 3 + 30,
        contract=contract,
    )


def latency_raw_contract(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """``latency_raw`` plus what the contract puts on the path: the floor of zmesh's p50."""
    return latency_raw(workdir, sizes, profile, contract=True)


def _dealer_router(
    workdir: Path,
    profile: Path | None,
    *,
    lmdb: bool,
    sizes: Sizes,
    payload_bytes: int = PAYLOAD_BYTES,
    n: int = 0,
    consumers: int = 1,
    fanout: bool = False,
    batch: int = 1,
) -> dict[str, Any]:
    """``consumers`` ROUTERs: each message dealt to one by its partition, or with
    ``fanout`` sent to each; ``batch`` messages a frame (one LMDB record each)."""
    n = n or sizes.dealer_router
    deadline_s = sizes.deadline(n, 30_000 if payload_bytes == PAYLOAD_BYTES else 200)
    # A window of 1,000 messages, or of 16 MiB for large payloads (zmesh's byte window);
    # of 80 frames in batches (zmesh's max_in_flight, 8,000 messages).
    window = 80 * batch if batch > 1 else max(1, min(1000, (16 << 20) // payload_bytes))
    with children(workdir, profile) as kids:
        routers = [
            kids.start(
                "raw_router",
                name="raw-router" if consumers == 1 else f"raw-router-{i + 1}",
                ack_every=100,
                warmup=n // 10 // (1 if fanout else consumers),
                batch=batch,
                deadline_s=deadline_s,
            )
            for i in range(consumers)
        ]
        endpoints = [router.expect("ready", 15)["endpoint"] for router in routers]
        lmdb_dir = workdir / "raw-outbox"
        dealer = kids.start(
            "raw_dealer",
            name="raw-dealer",
            endpoints=endpoints,
            partitions=TopicConfig().partitions,  # (a topic's default: zmesh's side of it)
            window=window,
            chunk=min(100, window),
            payload_bytes=payload_bytes,
            fanout=fanout,
            batch=batch,
            warmup=n // 10,
            count=n,
            lmdb_dir=str(lmdb_dir) if lmdb else None,
            deadline_s=deadline_s,
        )
        res = dealer.expect("result", deadline_s)
        for router in routers:
            router.send("stop")
        got = [router.expect("result", 30) for router in routers]
    rate = n / (res["t1"] - res["t0"])
    names = ["consumer"] if consumers == 1 else [f"consumer-{i + 1}" for i in range(consumers)]
    return {
        "rate": rate,
        "mb_per_s": rate * payload_bytes / 1e6,
        "seconds": res["t1"] - res["t0"],
        "rss_mb": {
            "producer": res["rss_mb"],
            **{k: g["rss_mb"] for k, g in zip(names, got, strict=True)},
        },
        "cpu_us_per_msg": {
            "producer": res["cpu_s"] * 1e6 / n,
            # (each consumer's per message it received)
            **{
                k: g["cpu_s"] * 1e6 / max(1, g["received"]) for k, g in zip(names, got, strict=True)
            },
        },
    }


def raw_dealer_router_acks(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    return _dealer_router(workdir, profile, lmdb=False, sizes=sizes)


def raw_dealer_router_lmdb(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    return _dealer_router(workdir, profile, lmdb=True, sizes=sizes)


def raw_dealer_router_lmdb_2(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """The LMDB outbox sender dealing its messages' partitions to two consumers, as a
    shared group's two members get a producer's keyless messages: the floor of
    ``zmesh_shared_2_members``."""
    return _dealer_router(workdir, profile, lmdb=True, sizes=sizes, consumers=2)


def raw_dealer_router_lmdb_fanout_4(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """The LMDB outbox sender sending every message to four consumers, a window each, a
    message deleted once all four acked it (four groups of one member each): the floor
    of ``fanout_4_groups``."""
    return _dealer_router(
        workdir, profile, lmdb=True, sizes=sizes, consumers=4, fanout=True, n=sizes.fanout * 4
    )


def raw_dealer_router_lmdb_100(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """The LMDB outbox sender with 100 messages a frame, each frame one record, acked a
    frame at a time: the floor of ``zmesh_batch_process``."""
    return _dealer_router(workdir, profile, lmdb=True, sizes=sizes, n=sizes.raw_batched, batch=100)


def raw_dealer_router_lmdb_16k(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """The LMDB outbox sender with 16 KiB payloads: the floor of ``zmesh_16k``."""
    return _dealer_router(
        workdir, profile, lmdb=True, sizes=sizes, payload_bytes=16 << 10, n=sizes.large_16k
    )


def raw_dealer_router_lmdb_256k(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """The LMDB outbox sender with 256 KiB payloads: the floor of ``zmesh_256k``."""
    return _dealer_router(
        workdir, profile, lmdb=True, sizes=sizes, payload_bytes=256 << 10, n=sizes.large_256k
    )


SCENARIOS = {
    "raw_pushpull_1": raw_pushpull_1,
    "raw_pushpull_100": raw_pushpull_100,
    "raw_pushpull_16k": raw_pushpull_16k,
    "raw_pushpull_256k": raw_pushpull_256k,
    "raw_dealer_router_acks": raw_dealer_router_acks,
    "raw_dealer_router_lmdb": raw_dealer_router_lmdb,
    "raw_dealer_router_lmdb_2": raw_dealer_router_lmdb_2,
    "raw_dealer_router_lmdb_fanout_4": raw_dealer_router_lmdb_fanout_4,
    "raw_dealer_router_lmdb_100": raw_dealer_router_lmdb_100,
    "raw_dealer_router_lmdb_16k": raw_dealer_router_lmdb_16k,
    "raw_dealer_router_lmdb_256k": raw_dealer_router_lmdb_256k,
    "latency_raw": latency_raw,
    "latency_raw_contract": latency_raw_contract,
}
