"""What the IO thread does with the commands it takes (``Commands.drain``): publishes
collected for the iteration's stage, acks, settlements, subscriptions, calls and the
rest applied in the order they were queued."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import MessageStateError
from .commands import (
    Abandon,
    Call,
    Command,
    Contact,
    Extend,
    Request,
    Respond,
    Settle,
    SetTopic,
    Stop,
    Subscribe,
    Tx,
    Unsubscribe,
    Watch,
)
from .inbox.origin import Origin
from .limits import MAX_PUBS_PER_LOOP
from .outbox.publishes import AnyPublish, Publish, Stretch, message_count
from .requests import accept, send_reply

if TYPE_CHECKING:
    from .._receipt import Receipt
    from .._store.store import WriteBatch
    from ..subscription import Subscription
    from .commit import Committer
    from .inbox.consumer import Consumer
    from .mesh import Mesh
    from .outbox.outbox import Outbox
    from .submit import Submitter

log = logging.getLogger(__name__)


class Commands:
    """What the IO thread does with the commands it takes (``drain``)."""

    def __init__(
        self, queue: Submitter, consumer: Consumer, outbox: Outbox, commits: Committer
    ) -> None:
        self.queue = queue
        self.consumer = consumer
        self.outbox = outbox
        self.commits = commits
        self.mesh: Mesh | None = None  # (made on the IO thread, at start)
        self.local: list[Subscription] = []  # this node's subscriptions, as applied
        self.watches: list[Receipt] = []  # receipts to track after this iteration's commit

    def drain(
        self,
        wb: WriteBatch,
        pubs: list[AnyPublish],
        calls: list[Call],
        now: float,
        max_pubs: int = MAX_PUBS_PER_LOOP,
    ) -> bool:
        """Apply queued commands in order; stops once ``max_pubs`` publishes are collected
        (the rest waits for the next iteration, so one transaction stays bounded).
        Returns whether the node is to stop."""
        take = self.queue.take
        consumer = self.consumer
        stop = subs_changed = False
        count = message_count(pubs)
        while count < max_pubs and (cmd := take()) is not None:
            kind = type(cmd)
            if kind is Stretch:  # plain publish() calls
                staged = cmd.staged()  # type: ignore[union-attr]
                pubs.append(staged)
                count += staged.count
            elif kind is Publish:  # publish() with options
                pubs.append(cmd)  # type: ignore[arg-type]
                count += 1
            elif kind is list:  # publish_many()
                pubs.extend(cmd)  # type: ignore[arg-type]
                count += message_count(cmd)  # type: ignore[arg-type]
            elif kind is Origin:  # a batch's messages acked one by one
                consumer.acked_seqs(cmd, cmd.take_acks(), wb)  # type: ignore[arg-type, union-attr]
            elif kind is Stop:
                stop = True
            elif kind is Subscribe or kind is Unsubscribe:
                self._subscription(cmd)  # type: ignore[arg-type]
                subs_changed = True
            elif kind is Tx:
                if cmd.take():  # type: ignore[union-attr]
                    count += self._tx(cmd, wb, pubs, calls)  # type: ignore[arg-type]
            elif kind is Call:
                self._call(cmd, wb, now, calls)  # type: ignore[arg-type]
            elif kind is Request:
                if subs_changed:  # (a serve() queued before it: its lanes' member first)
                    assert self.mesh is not None
                    self.mesh.subs_changed(wb, now)
                    subs_changed = False
                if accept(cmd, self.outbox, self.queue, wb, now):  # type: ignore[arg-type]
                    pubs.append(cmd.pub)  # type: ignore[union-attr]
                    count += 1
            else:
                self._other(cmd, wb, now)
        if subs_changed:  # one hello for any number of (un)subscribes
            assert self.mesh is not None
            self.mesh.subs_changed(wb, now)
        return stop

    def _subscription(self, cmd: Subscribe | Unsubscribe) -> None:
        if isinstance(cmd, Subscribe):
            self.local.append(cmd.sub)
            self.consumer.add(cmd.sub)
        else:
            if cmd.sub in self.local:
                self.local.remove(cmd.sub)
            self.consumer.remove(cmd.sub)

    def _tx(self, cmd: Tx, wb: WriteBatch, pubs: list[AnyPublish], calls: list[Call]) -> int:
        released = self.consumer.acked(cmd.acks, wb)
        calls.append(cmd.done)
        if released is not None:  # (nothing of it happens: as a withdrawn one)
            error = MessageStateError(
                f"message {released.id} was released when its subscription closed, before "
                "the transaction committed: nothing of it was stored or settled"
            )
            cmd.done.error = error
            for pub in cmd.pubs:
                pub.stage.error = error
            self.queue.abandon(len(cmd.pubs), sum(len(p.payload) for p in cmd.pubs))
            return 0
        pubs.extend(cmd.pubs)
        self.commits.tx_pubs.update(id(p) for p in cmd.pubs)
        return len(cmd.pubs)

    @staticmethod
    def _call(call: Call, wb: WriteBatch, now: float, calls: list[Call]) -> None:
        try:
            call.result = call.fn(wb, now)
        except BaseException as exc:
            call.error = exc
        calls.append(call)

    def _other(self, cmd: Command, wb: WriteBatch, now: float) -> None:
        if isinstance(cmd, Settle):
            self.consumer.settle(cmd.msg, cmd.how, cmd.arg)
        elif isinstance(cmd, Extend):
            self.consumer.touch(cmd.msg)
        elif isinstance(cmd, Watch):
            self.watches.append(cmd.receipt)
        elif isinstance(cmd, Contact):
            mesh = self.mesh
            assert mesh is not None
            found = cmd.found
            peer = None if found.node_id is None else mesh.peers.get(found.node_id)
            if peer is None or (not peer.alive and peer.ctrl_ep != found.endpoint):
                mesh.contact(found.endpoint, seed=found.seed, key=found.key)
        elif isinstance(cmd, SetTopic):
            self.outbox.set_topic(cmd.topic, cmd.config, wb, now)
        elif isinstance(cmd, Respond):
            assert self.mesh is not None
            send_reply(self.mesh, cmd, self.queue.node_id, self.outbox.lanes.counters)
        elif isinstance(cmd, Abandon):
            log.warning(
                "a transaction was dropped without commit or abort: its %d "
                "publishes were discarded",
                cmd.count,
            )
            self.queue.abandon(cmd.count, cmd.nbytes)
        else:
            raise TypeError(f"not a command: {cmd!r}")
