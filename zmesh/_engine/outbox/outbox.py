"""A producer's outbox: its parts, each the one owner of its state, composed (IO thread
only, but for ``Outcomes``, which receipts read).

- ``Lanes``: the topics and their lanes, which lanes have work (lanes.py);
- ``Records``: the stored messages, found by sequence, and the outbox's depth (records.py);
- ``Receipts``: which receipts wait for acks (receipts.py);
- ``DeadLetters``: parked messages (deadletters.py);
- ``Settler``: what settling does to the outbox (settle.py);
- ``Groups``: lanes made, retired, listed (groups.py), and the groups subscribed by
  pattern (patterns.py);
- ``Retained``: messages kept for replay (retained.py), and values kept per key
  (kept.py);
- ``Staging``: publishes into the store, then into their lanes (staging.py, spill.py);
- ``Dispatcher``: ready messages to live members (dispatch.py).
"""

from __future__ import annotations

import math

from ..._store.store import Store, WriteBatch
from ..._subjects import is_pattern
from ...config import TopicConfig
from ..stats import Counters
from .deadletters import DeadLetters
from .dispatch import Dispatcher
from .groups import Groups
from .lanes import Lanes
from .outcomes import Outcomes
from .receipts import Receipts
from .records import Records
from .restart import load_outbox
from .retained import Retained
from .retention import Indexes
from .settle import Settler
from .staging import Staging
from .wallclock import WallClock


class Outbox:
    """The parts of one producer's outbox, wired to each other."""

    def __init__(
        self,
        store: Store,
        node_id: bytes,
        next_seq: int,
        next_lane: int,
        topics: dict[str, TopicConfig],
        memory_budget_bytes: int,
        max_message_bytes: int,
        counters: Counters,
        outcomes: Outcomes,
        dedupe_window_s: float = math.inf,
    ) -> None:
        self.store = store
        self.clock = WallClock()  # (taken up by the engine from the store at its start)
        self.lanes = Lanes(node_id, topics, next_lane, counters)
        self.records = Records(store, counters, max_message_bytes)
        self.receipts = Receipts()
        self.indexes = Indexes(store.next_indexes())
        self.retained = Retained(
            store, self.lanes, self.records, self.indexes, counters, self.clock
        )
        self.dead = DeadLetters(store, self.lanes, self.records, self.retained, outcomes, node_id)
        self.settler = Settler(self.lanes, self.records, self.receipts, self.dead, outcomes)
        self.kept = self.retained.kept
        self.groups = Groups(
            self.lanes,
            self.records,
            self.settler,
            self.dead,
            outcomes,
            counters,
            self.kept,
            self.clock,
        )
        self.staging = Staging(
            store,
            self.lanes,
            self.records,
            self.receipts,
            self.settler,
            self.indexes,
            self.retained,
            counters,
            next_seq,
            memory_budget_bytes,
            self.groups.patterns,
            self.clock,
            dedupe_window_s,
        )
        self.dispatcher = Dispatcher(self.lanes, self.records, self.settler, counters)

    def load(self, now: float, batch: WriteBatch) -> None:
        """Reopen what the store holds (a start): lanes, runs, depth, dead letters."""
        load_outbox(
            self.store, self.lanes, self.records, self.dead, self.groups.patterns, now, batch
        )
        self.configure(list(self.lanes.topics.items()), batch, now)

    def set_topic(self, name: str, cfg: TopicConfig, batch: WriteBatch, now: float) -> None:
        """The configuration of a topic (or of the topics a pattern matches) from now on."""
        self.configure([(name, cfg)], batch, now)

    def configure(
        self, configs: list[tuple[str, TopicConfig]], batch: WriteBatch, now: float
    ) -> None:
        """Configurations of topics or patterns from now on: lanes' timing, the key index
        of latest-wins topics, declared groups' lanes (a pattern's: remembered, with the
        lanes of the topics it matches), and how many replicas hold a topic's messages
        (set per topic: ``Node.topic`` refuses replicas for a pattern)."""
        for topic in self.lanes.configure(configs):
            if self.lanes.config(topic).latest_wins:
                self.settler.index_latest(topic, batch)
        declared = []
        for name, cfg in configs:
            if not is_pattern(name):
                self.receipts.replicate(name, cfg.replicas)
            for group in cfg.groups:
                if is_pattern(name):
                    declared.append((name, group, group, "shared", None))
                else:
                    self.groups.ensure(name, group, group, "shared", batch, now)
        if declared:
            self.groups.patterns.remember(declared, batch, now)

    @property
    def depth(self) -> int:
        """Messages in the outbox (what some lane owes)."""
        return self.records.depth
