"""zmesh: brokerless publish/subscribe with mDNS discovery, ZeroMQ transport and an LMDB
outbox, delivering at least once per group with retries at the producer.
"""

from ._receipt import MessageId, Receipt
from .config import NodeConfig, SubscriptionConfig, TopicConfig
from .deadletters import DeadLetter
from .errors import (
    ArgumentError,
    ConfigError,
    DataDirLockedError,
    DecodeError,
    MessageStateError,
    NodeStateError,
    OutboxFullError,
    StoreError,
    StoreFullError,
    TimeoutError,
    ZMeshError,
)
from .node import Node
from .subscription import Message, Subscription
from .transaction import Transaction

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ConfigError",
    "DataDirLockedError",
    "DeadLetter",
    "DecodeError",
    "Message",
    "MessageId",
    "MessageStateError",
    "Node",
    "NodeConfig",
    "NodeStateError",
    "OutboxFullError",
    "Receipt",
    "StoreError",
    "StoreFullError",
    "Subscription",
    "SubscriptionConfig",
    "TimeoutError",
    "TopicConfig",
    "Transaction",
    "ZMeshError",
]
