"""Message counts and durations of a full run and of a quick (smoke) run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each scenario sends (messages unless named otherwise)."""

    raw: int = 2_000_000  # raw PUSH/PULL, one message per frame
    raw_batched: int = 20_000_000  # raw PUSH/PULL, 100 messages per frame
    dealer_router: int = 1_000_000  # raw DEALER/ROUTER with acks (and LMDB)
    zmesh: int = 1_000_000  # zmesh per-message scenarios (each durability)
    zmesh_batch: int = 3_000_000  # zmesh publish_many / fetch + ack_many
    large_16k: int = 100_000  # 16 KiB messages (zmesh_16k and its raw baseline)
    large_256k: int = 10_000  # 256 KiB messages
    peer: int = 200_000  # a peer's (--peers) per-message scenario with acks
    peer_batch: int = 400_000  # a peer's scenario with one ack per batch
    fanout: int = 400_000  # zmesh fan-out, messages (each group gets all)
    idle_lanes: int = 2_000  # idle lanes beside the busy one (zmesh_many_lanes)
    offline: int = 2_000_000  # backlog published while the group is offline
    memory_offline: int = 1_200_000  # the same of a memory topic (120 MB of payloads)
    restart: int = 1_000_000  # pending messages when the producer restarts
    latency_s: float = 5.0  # paced latency run, seconds
    latency_rate: float = 1000.0  # msgs/s of the paced latency runs
    latency_warmup: int = 500
    warmup: int = 5_000  # zmesh warm-up messages before timing
    batch: int = 100  # messages per publish_many and per fetch
    restart_window_s: float = 2.0  # delivery rate measured after the first message
    min_rate: float = 2_000.0  # slowest plausible zmesh rate, for deadlines

    def deadline(self, count: int, min_rate: float | None = None) -> float:
        """A generous bound for sending ``count`` messages: a hang fails, a slow run not."""
        return count / (min_rate or self.min_rate) + 60.0


FULL = Sizes()
QUICK = Sizes(
    raw=100_000,
    raw_batched=500_000,
    dealer_router=50_000,
    zmesh=10_000,
    zmesh_batch=50_000,
    large_16k=2_000,
    large_256k=200,
    peer=5_000,
    peer_batch=10_000,
    fanout=5_000,
    idle_lanes=200,
    offline=20_000,
    memory_offline=20_000,
    restart=20_000,
    latency_s=1.0,
    latency_warmup=100,
    warmup=1_000,
    restart_window_s=0.5,
)
