"""zmesh: brokerless publish/subscribe with mDNS discovery, ZeroMQ transport and an LMDB
outbox, delivering at least once per group with retries at the producer.
"""

from ._engine.outbox.outcomes import Outcome
from ._receipt import MessageId, Receipt
from ._requests import Reply
from .config import NodeConfig, ProducerConfig, RelayConfig, SubscriptionConfig, TopicConfig
from .deadletters import DeadLetter
from .errors import (
    ArgumentError,
    ConfigError,
    DataDirLockedError,
    DecodeError,
    MessageStateError,
    NodeClosedError,
    NodeStateError,
    NoRespondersError,
    NotDeliveredError,
    OutboxFullError,
    ReplyError,
    StoreError,
    StoreFullError,
    TimeoutError,
    ZMeshError,
)
from .node import Node, PublishOptions
from .replay import ReplayReader
from .subscription import Message, Subscription
from .transaction import Transaction

__version__ = "0.1.0"


def snapshot(data_dir: str, dest: str) -> None:
    """Copy a node's data dir consistently (its node may be running, in any process)."""
    from ._store.snapshot import check_path, snapshot_data_dir

    snapshot_data_dir(check_path(data_dir, "data_dir"), check_path(dest, "dest"))


__all__ = [
    "ArgumentError",
    "ConfigError",
    "DataDirLockedError",
    "DeadLetter",
    "DecodeError",
    "Message",
    "MessageId",
    "MessageStateError",
    "NoRespondersError",
    "Node",
    "NodeClosedError",
    "NodeConfig",
    "NodeStateError",
    "NotDeliveredError",
    "OutboxFullError",
    "Outcome",
    "ProducerConfig",
    "PublishOptions",
    "Receipt",
    "RelayConfig",
    "ReplayReader",
    "Reply",
    "ReplyError",
    "StoreError",
    "StoreFullError",
    "Subscription",
    "SubscriptionConfig",
    "TimeoutError",
    "TopicConfig",
    "Transaction",
    "ZMeshError",
    "snapshot",
]
