"""zmesh scenarios, the parent side: start the nodes' processes, time one repetition.

Throughput is messages acknowledged end to end per second: from the producer's first
timed publish until every receipt of the timed messages is acked (after a warm-up that is
itself acked). Each function returns ``rate``, ``rss_mb`` per process and its own figures.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from ._child import BenchError, Child, children
from ._wio import PAYLOAD_BYTES
from .sizes import Sizes

TOPIC = "bench"
# The consumer API of the backlog drain and of the restart; their rates are compared with
# the live scenario of the same API (zmesh_process for "message").
DRAIN_API = "message"
DRAIN_REFERENCE = {"message": "zmesh_process", "batch": "zmesh_batch_process"}[DRAIN_API]


def _mesh() -> str:
    return f"bench-{uuid.uuid4().hex[:10]}"


def _consumer(
    kids: Any,
    workdir: Path,
    mesh: str,
    group: str,
    *,
    seeds: list[str],
    api: str,
    sizes: Sizes,
    deadline_s: float,
    member: str = "",
    **extra: Any,
) -> Child:
    name = f"consumer-{group}{member}"
    return kids.start(
        "zmesh_consumer",
        name=name,
        mesh=mesh,
        data_dir=str(workdir / name),
        seeds=seeds,
        topic=TOPIC,
        group=group,
        api=api,
        fetch=sizes.batch,
        deadline_s=deadline_s,
        **extra,
    )


def _live(
    workdir: Path,
    sizes: Sizes,
    profile: Path | None,
    *,
    durability: str,
    api: str,
    count: int,
    groups: tuple[str, ...] = ("g",),
    rate: float = 0.0,
    warmup: int | None = None,
    idle: int = 0,
    members: int = 1,
    payload_bytes: int = PAYLOAD_BYTES,
    replicas: int = 1,
) -> dict[str, Any]:
    mesh = _mesh()
    warmup = sizes.warmup if warmup is None else warmup
    deadline_s = (sizes.latency_s * 3 + 60) if rate else sizes.deadline(count * len(groups))
    with children(workdir, profile) as kids:
        prod = kids.start(
            "zmesh_producer",
            name="producer",
            mesh=mesh,
            data_dir=str(workdir / "producer"),
            topic=TOPIC,
            durability=durability,
            groups=list(groups),
            api=api,
            batch=sizes.batch,
            warmup=warmup,
            count=count,
            rate=rate,
            deadline_s=deadline_s,
            members=members,
            payload_bytes=payload_bytes,
            replicas=replicas,
        )
        control = prod.expect("ready", 30)["control"]
        # Replica hosts of their own (the consumers host none): replicas - 1 of them.
        reps = [
            kids.start(
                "zmesh_replica",
                name=f"replica-{i + 1}",
                mesh=mesh,
                data_dir=str(workdir / f"replica-{i + 1}"),
                seeds=[control],
                deadline_s=deadline_s,
            )
            for i in range(replicas - 1)
        ]
        for r in reps:
            r.expect("ready", 30)
        # Members of one group share its messages: each counts its own (no expected total).
        names = [(g, f"-{i + 1}" if members > 1 else "") for g in groups for i in range(members)]
        cons = [
            _consumer(
                kids,
                workdir,
                mesh,
                g,
                seeds=[control],
                api=api,
                sizes=sizes,
                deadline_s=deadline_s,
                latency=bool(rate),
                idle=idle,
                member=m,
                expect=warmup + count if members == 1 else 0,
                warmup=warmup if members == 1 else 0,
            )
            for g, m in names
        ]
        for c in cons:
            c.expect("ready", 30)
        res = prod.expect("result", deadline_s)
        for c in (*cons, *reps):
            c.send("stop")
        got = [c.expect("result", 30) for c in cons]
        held = [r.expect("result", 30) for r in reps]
    t0 = res["t0"]
    out: dict[str, Any] = {
        "seconds": res["t1"] - t0,
        "publish_seconds": res["t_published"] - t0,  # the rest of a run drains the backlog
        "rss_mb": {
            "producer": res["rss_mb"],
            **{f"consumer_{g}{m}": r["rss_mb"] for (g, m), r in zip(names, got, strict=True)},
            **{f"replica_{i + 1}": r["rss_mb"] for i, r in enumerate(held)},
        },
        "cpu_us_per_msg": {
            "producer": res["cpu_s"] * 1e6 / count,
            # (one member of a group: from its last warm-up message; two: all it received)
            **{
                f"consumer_{g}{m}": r["cpu_s"] * 1e6 / max(1, r["count"] if m else count)
                for (g, m), r in zip(names, got, strict=True)
            },
            # (a replica's: over its whole life, warm-up and set-up included)
            **{f"replica_{i + 1}": r["cpu_s"] * 1e6 / count for i, r in enumerate(held)},
        },
        "producer_stats": {
            k: v
            for k, v in res["stats"].items()
            if k
            in (
                "redelivered_member_gone",
                "ack_timeouts",
                "nacked",
                "data_send_blocked",
                "control_send_full",
                "duplicates_dropped",
                "spilled",
                "store_full",
                "publish_store_full",
                "map_grown",
            )
        },
    }
    if rate:
        out["rate"] = count / (res["t_published"] - t0)
        out.update({k: got[0][k] for k in ("p50_ms", "p99_ms", "max_ms", "samples")})
    elif len(groups) > 1:
        per_group = {g: count / (res["lanes_done"][g] - t0) for g in groups}
        out["group_rates"] = per_group
        out["rate"] = min(per_group.values())
        out["deliveries_per_s"] = count * len(groups) / (res["t1"] - t0)
    else:
        out["rate"] = count / (res["t1"] - t0)
    out["mb_per_s"] = out["rate"] * payload_bytes / 1e6
    return out


def zmesh_process(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    return _live(workdir, sizes, profile, durability="process", api="message", count=sizes.zmesh)


def zmesh_fsync(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    return _live(workdir, sizes, profile, durability="fsync", api="message", count=sizes.zmesh)


def zmesh_memory(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    return _live(workdir, sizes, profile, durability="memory", api="message", count=sizes.zmesh)


def zmesh_batch_process(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    return _live(
        workdir,
        sizes,
        profile,
        durability="process",
        api="batch",
        count=sizes.zmesh_batch,
        warmup=sizes.warmup * 4,
    )


def latency_zmesh_process(
    workdir: Path, sizes: Sizes, profile: Path | None = None, replicas: int = 1
) -> dict[str, Any]:
    return _live(
        workdir,
        sizes,
        profile,
        durability="process",
        api="message",
        count=int(sizes.latency_s * sizes.latency_rate),
        rate=sizes.latency_rate,
        warmup=sizes.latency_warmup,
        replicas=replicas,
    )


def _large(
    workdir: Path, sizes: Sizes, profile: Path | None, n: int, payload_bytes: int
) -> dict[str, Any]:
    """``zmesh_process`` with ``n`` payloads of ``payload_bytes`` (a tenth more to warm up)."""
    return _live(
        workdir,
        sizes,
        profile,
        durability="process",
        api="message",
        count=n,
        warmup=n // 10,
        payload_bytes=payload_bytes,
    )


def zmesh_16k(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """``zmesh_process`` with 16 KiB payloads."""
    return _large(workdir, sizes, profile, sizes.large_16k, 16 << 10)


def zmesh_256k(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """``zmesh_process`` with 256 KiB payloads."""
    return _large(workdir, sizes, profile, sizes.large_256k, 256 << 10)


def zmesh_replicas_2(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """``zmesh_process`` with the topic's replicas at 2: every receipt waits for a replica
    host (a process of its own) to hold its message."""
    return _live(
        workdir, sizes, profile, durability="process", api="message", count=sizes.zmesh, replicas=2
    )


def latency_zmesh_replicas_2(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    return latency_zmesh_process(workdir, sizes, profile, replicas=2)


def zmesh_many_lanes(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """``zmesh_process`` with the consumer subscribed to ``sizes.idle_lanes`` more topics
    nobody publishes: a lane each at the producer, idle."""
    return _live(
        workdir,
        sizes,
        profile,
        durability="process",
        api="message",
        count=sizes.zmesh,
        idle=sizes.idle_lanes,
    )


def zmesh_shared_2_members(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """``zmesh_process`` with two consumer processes in the group, sharing its partitions."""
    return _live(
        workdir, sizes, profile, durability="process", api="message", count=sizes.zmesh, members=2
    )


def fanout_4_groups(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    return _live(
        workdir,
        sizes,
        profile,
        durability="process",
        api="message",
        count=sizes.fanout,
        groups=("g1", "g2", "g3", "g4"),
    )


def offline_backlog(workdir: Path, sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    """Publish a backlog while the group is offline; then its consumer comes and drains it."""
    return _offline(workdir, sizes, profile, sizes.offline)


# The memory budget of ``memory_offline_budget``: its producer's RSS may grow by 4 times it.
MEMORY_BUDGET_BYTES = 2 << 20


def memory_offline_budget(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """``offline_backlog`` of a ``memory`` topic under a 2 MiB memory budget: what is over
    the budget spills to LMDB, and the producer's RSS over its RSS before publishing."""
    return _offline(
        workdir,
        sizes,
        profile,
        sizes.memory_offline,
        durability="memory",
        budget=MEMORY_BUDGET_BYTES,
    )


def _offline(
    workdir: Path, sizes: Sizes, profile: Path | None, n: int, **topic: Any
) -> dict[str, Any]:
    mesh = _mesh()
    deadline_s = sizes.deadline(n, 1_000) + 120
    with children(workdir, profile) as kids:
        prod = kids.start(
            "zmesh_offline_producer",
            name="producer",
            mesh=mesh,
            data_dir=str(workdir / "producer"),
            topic=TOPIC,
            group="g",
            count=n,
            batch=1000,
            deadline_s=deadline_s,
            **topic,
        )
        ready_p = prod.expect("ready", 30)
        pub = prod.expect("published", deadline_s)
        prod.send("drain")
        cons = _consumer(
            kids,
            workdir,
            mesh,
            "g",
            seeds=[ready_p["control"]],
            api=DRAIN_API,
            sizes=sizes,
            deadline_s=deadline_s,
            expect=n,
        )
        ready = cons.expect("ready", 30)
        drained = prod.expect("drained", deadline_s)
        cons.send("stop")
        got = cons.expect("result", 30)
    seconds = drained["t_empty"] - ready["t_subscribed"]
    base, after = ready_p["rss_base"], pub["rss_now"]
    return {
        "rate": n / seconds,
        "seconds": seconds,
        "backlog": pub["outbox"],
        "publish_rate": pub["publish_rate"],
        "producer_rss_after_publish_mb": pub["rss_mb"],
        "producer_rss_after_publish": after,
        "producer_rss_base": base,
        "rss_over_base_mb": round(after["VmRSS"] - base["VmRSS"], 1),
        "first_message_after_reconnect_s": got["t_first"] - ready["t_subscribed"],
        "rss_mb": {"producer": drained["rss_mb"], "consumer": got["rss_mb"]},
        "cpu_us_per_msg": {
            "producer": drained["cpu_s"] * 1e6 / n,  # (the drain's)
            "consumer": got["cpu_s"] * 1e6 / max(1, got["count"]),
        },
    }


def window_rate(got: dict[str, Any], n: int, window_s: float, who: str) -> float:
    """The delivery rate after a restart: in the window after the first message, or the
    backlog's own when all of it came within the window."""
    window = got["window_count"]
    if 0 < window < n:
        return float(window / window_s)
    if got["t_last"]:
        return n / max(1e-6, got["t_last"] - got["t_first"])
    raise BenchError(
        f"{who} delivered {got['count']} of {n} messages, none within {window_s:g}s of the first"
    )


def restart_first_message(
    workdir: Path, sizes: Sizes, profile: Path | None = None
) -> dict[str, Any]:
    """Reopen a producer with a large backlog; time its first delivery to a waiting consumer."""
    mesh, n = _mesh(), sizes.restart
    deadline_s = sizes.deadline(n, 1_000) + 120
    data_dir = str(workdir / "producer")
    with children(workdir, profile) as kids:
        build = kids.start(
            "zmesh_build_producer",
            name="producer-build",
            mesh=mesh,
            data_dir=data_dir,
            topic=TOPIC,
            group="g",
            count=n,
            batch=1000,
            deadline_s=deadline_s,
        )
        built = build.expect("built", deadline_s)
        try:
            build.proc.wait(60)  # its data dir lock is released
        except subprocess.TimeoutExpired as exc:
            raise BenchError(
                f"{build.name} did not exit within 60s after building the backlog{build.tail()}"
            ) from exc
        cons = _consumer(
            kids,
            workdir,
            mesh,
            "g",
            seeds=[],
            api=DRAIN_API,
            sizes=sizes,
            deadline_s=deadline_s,
            expect=n,
            window_s=sizes.restart_window_s,
        )
        control = cons.expect("ready", 30)["control"]
        prod = kids.start(
            "zmesh_restart_producer",
            name="producer-restarted",
            mesh=mesh,
            data_dir=data_dir,
            seeds=[control],
            count=n,
            deadline_s=deadline_s,
        )
        started = prod.expect("started", 300)
        first = cons.expect("first", 300)
        time.sleep(sizes.restart_window_s + 0.3)
        cons.send("stop")
        got = cons.expect("result", 30)
        prod.send("stop")
        closed = prod.expect("result", 60)
    rate = window_rate(got, n, sizes.restart_window_s, "the restarted producer")
    return {
        "first_message_s": first["t"] - started["t0"],
        "node_start_s": started["t_started"] - started["t0"],
        "producer_rss_after_start": started["rss_now"],
        "rate": rate,
        "backlog": built["outbox"],
        "build_publish_rate": built["publish_rate"],
        "rss_mb": {
            "producer_build": built["rss_mb"],
            "producer": closed["rss_mb"],
            "consumer": got["rss_mb"],
        },
        "cpu_us_per_msg": {"consumer": got["cpu_s"] * 1e6 / max(1, got["count"])},
    }


SCENARIOS = {
    "zmesh_process": zmesh_process,
    "zmesh_fsync": zmesh_fsync,
    "zmesh_memory": zmesh_memory,
    "zmesh_batch_process": zmesh_batch_process,
    "latency_zmesh_process": latency_zmesh_process,
    "zmesh_16k": zmesh_16k,
    "zmesh_256k": zmesh_256k,
    "zmesh_replicas_2": zmesh_replicas_2,
    "latency_zmesh_replicas_2": latency_zmesh_replicas_2,
    "fanout_4_groups": fanout_4_groups,
    "zmesh_many_lanes": zmesh_many_lanes,
    "zmesh_shared_2_members": zmesh_shared_2_members,
    "offline_backlog": offline_backlog,
    "memory_offline_budget": memory_offline_budget,
    "restart_first_message": restart_first_message,
}
