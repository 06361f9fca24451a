"""The bridge client against a ROUTER of the test's own: several requests unanswered at
once, replies in request order, and a request that gets no answer sent again (with those
after it) until it does, or until the attempts run out."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import zmq

from zmesh.spark import BridgeError
from zmesh.spark._client import BridgeClient
from zmesh.spark._wire import Reply, Request, decode_request, encode_reply

Answer = Callable[[Request, int], bool]  # (request, times seen) -> answer it?


class FakeBridge(threading.Thread):
    """A ROUTER on 127.0.0.1 that answers a request, or not, as ``answer`` says, and
    answers the requests it holds back in reverse order once it has two."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(name="fake-bridge", daemon=True)
        self.answer = answer
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seen: list[int] = []  # tokens, in the order they came
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            if not self.sock.poll(20):
                continue
            route, *frames = self.sock.recv_multipart()
            req = decode_request(frames)
            self.seen.append(req.token)
            if self.answer(req, self.seen.count(req.token)):
                result = {"n": req.args["n"]}
                self.sock.send_multipart([route, *encode_reply(Reply(req.token, True, result))])

    def close(self) -> None:
        self._halt.set()
        self.join(5)
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def fake() -> Iterator[Callable[[Answer], FakeBridge]]:
    made: list[FakeBridge] = []

    def make(answer: Answer) -> FakeBridge:
        bridge = FakeBridge(answer)
        bridge.start()
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        bridge.close()


def requests(n: int) -> list[tuple[dict, tuple[bytes, ...]]]:
    return [({"n": i}, (b"x",)) for i in range(n)]


def test_replies_come_in_request_order_with_several_unanswered(
    fake: Callable[[Answer], FakeBridge],
) -> None:
    bridge = fake(lambda req, seen: True)
    with BridgeClient(bridge.endpoint, timeout_s=5) as client:
        got = [rep.result["n"] for rep in client.calls("publish", requests(10), window=3)]
    assert got == list(range(10))
    assert len(bridge.seen) == 10, "nothing sent twice"


def test_an_unanswered_request_is_sent_again_with_those_after_it(
    fake: Callable[[Answer], FakeBridge],
) -> None:
    # the second request is answered only the second time it comes
    bridge = fake(lambda req, seen: req.args["n"] != 1 or seen > 1)
    with BridgeClient(bridge.endpoint, timeout_s=0.3, attempts=3) as client:
        got = [rep.result["n"] for rep in client.calls("publish", requests(4), window=3)]
    assert got == [0, 1, 2, 3]
    tokens = bridge.seen
    assert tokens.count(tokens[1]) == 2, "the unanswered one again"
    assert tokens.count(tokens[2]) == 2, "the one sent after it, on the new socket, again"
    assert tokens.count(tokens[0]) == 1, "the answered one not"


def test_a_request_never_answered_fails_after_its_attempts(
    fake: Callable[[Answer], FakeBridge],
) -> None:
    bridge = fake(lambda req, seen: req.args["n"] != 2)
    with BridgeClient(bridge.endpoint, timeout_s=0.2, attempts=2) as client:
        got = []
        with pytest.raises(BridgeError, match="did not answer 'publish'.*2 times"):
            for rep in client.calls("publish", requests(5), window=2):
                got.append(rep.result["n"])
    assert got == [0, 1]
