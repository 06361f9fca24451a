"""A socket monitor's events, decoded by zmesh as pyzmq decodes them: real sockets on
loopback, a peer that connects and leaves."""

from __future__ import annotations

import zmq
from zmq.utils.monitor import parse_monitor_message

from zmesh._protocol.monitor import monitor_event


def test_events_decode_as_pyzmq_decodes_them() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    mon = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    dealer = ctx.socket(zmq.DEALER)
    try:
        router.bind("tcp://127.0.0.1:0")
        where = router.getsockopt_string(zmq.LAST_ENDPOINT)
        dealer.connect(where)
        dealer.send(b"hi")
        assert router.poll(5000)
        router.recv_multipart()
        dealer.close(linger=0)
        seen = []
        while len(seen) < 2 and mon.poll(5000):
            frames = mon.recv_multipart()
            ours, theirs = monitor_event(frames), parse_monitor_message(frames)
            assert (ours.event, ours.value, ours.endpoint) == (
                theirs["event"],
                theirs["value"],
                theirs["endpoint"],
            )
            seen.append(ours.event)
        assert seen == [zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED]
        assert ours.endpoint == where.encode()
    finally:
        dealer.close(linger=0)
        mon.close(linger=0)
        router.close(linger=0)
        ctx.term()
