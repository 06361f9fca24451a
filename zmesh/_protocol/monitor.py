"""A ZeroMQ socket monitor's event, decoded (pure, no I/O).

pyzmq's ``zmq.utils.monitor`` does the same, but it imports ``zmq.asyncio``, and with it
asyncio and ssl: about 3 MB of RSS in every node, which needs neither."""

from __future__ import annotations

import struct
from typing import NamedTuple

_HEAD = struct.Struct("=Hi")  # libzmq's first frame: the event (16 bits), its value (32)


class MonitorEvent(NamedTuple):
    event: int  # a zmq.EVENT_* flag
    value: int  # the socket's fd, an errno or a ZMTP protocol error, by event
    endpoint: bytes


def monitor_event(frames: list[bytes]) -> MonitorEvent:
    """The event one monitor message (two frames) says."""
    head, endpoint = frames
    event, value = _HEAD.unpack(head)
    return MonitorEvent(event, value, endpoint)
