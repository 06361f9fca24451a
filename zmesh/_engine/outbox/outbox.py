"""A producer's outbox: its parts, each the one owner of its state, composed (IO thread
only, but for ``Outcomes``, which receipts read).

- ``Lanes``: the topics and their lanes, which lanes have work (lanes.py);
- ``Records``: the stored messages, found by sequence, and the outbox's depth (records.py);
- ``Receipts``: which receipts wait for acks (receipts.py);
- ``DeadLetters``: parked messages (deadletters.py);
- ``Settler``: what settling does to the outbox (settle.py);
- ``Groups``: lanes made, retired, listed (groups.py);
- ``Retained``: messages kept for replay (retained.py);
- ``Staging``: publishes into the store, then into their lanes (staging.py, spill.py);
- ``Dispatcher``: ready messages to live members (dispatch.py).
"""

from __future__ import annotations

from ..._store.store import Store, WriteBatch
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
    ) -> None:
        self.store = store
        self.lanes = Lanes(node_id, topics, next_lane, counters)
        self.records = Records(store, counters, max_message_bytes)
        self.receipts = Receipts()
        self.indexes = Indexes(store.next_indexes())
        self.dead = DeadLetters(store, self.lanes, self.records, node_id)
        self.settler = Settler(self.lanes, self.records, self.receipts, self.dead, outcomes)
        self.groups = Groups(self.lanes, self.records, self.settler, self.dead, outcomes, counters)
        self.retained = Retained(store, self.lanes, self.records, self.indexes, counters)
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
        )
        self.dispatcher = Dispatcher(self.lanes, self.records, self.settler, counters)

    def load(self, now: float, batch: WriteBatch) -> None:
        """Reopen what the store holds (a start): lanes, runs, depth, dead letters."""
        load_outbox(self.store, self.lanes, self.records, self.dead, now, batch)
        for topic, cfg in list(self.lanes.topics.items()):
            self.set_topic(topic, cfg, batch, now)

    def set_topic(self, topic: str, cfg: TopicConfig, batch: WriteBatch, now: float) -> None:
        """``topic``'s configuration from now on: its lanes' timing, its declared groups'
        lanes, and the key index of a latest-wins topic."""
        self.lanes.configure(topic, cfg)
        self.receipts.replicate(topic, cfg.replicas)
        if cfg.latest_wins:
            self.settler.index_latest(topic)
        for group in cfg.groups:
            self.groups.ensure(topic, group, group, "shared", batch, now)

    @property
    def depth(self) -> int:
        """Messages in the outbox (what some lane owes)."""
        return self.records.depth
