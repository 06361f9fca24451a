"""zmesh benchmarks: zmesh against raw pyzmq baselines measured in the same run.

Run ``python -m benchmarks`` (``--quick`` for a short smoke run, ``--only NAME`` for some
scenarios, ``--json PATH`` for the results). Every scenario runs its producer and its
consumers as separate processes (``python -m benchmarks.worker ROLE PARAMS``) on
127.0.0.1 with ephemeral ports; see docs/performance.md for what the figures mean.
"""

from __future__ import annotations

SCENARIOS = (
    "raw_pushpull_1",
    "raw_pushpull_100",
    "raw_pushpull_16k",
    "raw_pushpull_256k",
    "raw_dealer_router_acks",
    "raw_dealer_router_lmdb",
    "raw_dealer_router_lmdb_2",
    "raw_dealer_router_lmdb_fanout_4",
    "raw_dealer_router_lmdb_100",
    "raw_dealer_router_lmdb_16k",
    "raw_dealer_router_lmdb_256k",
    "zmesh_process",
    "zmesh_fsync",
    "zmesh_memory",
    "zmesh_batch_process",
    "latency_raw",
    "latency_raw_contract",
    "latency_zmesh_process",
    "zmesh_16k",
    "zmesh_256k",
    "zmesh_replicas_2",
    "latency_zmesh_replicas_2",
    "fanout_4_groups",
    "zmesh_many_lanes",
    "zmesh_shared_2_members",
    "offline_backlog",
    "memory_offline_budget",
    "restart_first_message",
)

__all__ = ["SCENARIOS"]
