"""Whom a ``zmesh pub`` reaches: the groups of its topic whose members its node knows,
which owe it acks, and the ephemeral subscribers (``zmesh sub`` without ``--group``) it
sends what it publishes to, at most once, which never ack."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any

from .. import Node, Receipt
from .._subjects import matcher
from ..errors import TimeoutError
from .client import StopSignals

SERVING_POLL_S = 0.005  # how often the node is asked whether a peer serves the topic
# Only ephemeral subscribers found: the peers known stay the same this long before
# publishing (a group's member that said hello in the same moment is found first).
SETTLE_S = 0.2
STORED_CHECK_S = 0.1  # a wait for the messages to be stored looks for a stop signal this often


def ephemeral_subscribers(peers: Iterable[dict[str, Any]], topic: str) -> int:
    """How many ephemeral subscriptions of live peers match ``topic`` (a name or a
    pattern): the ones its producer sends what it publishes to from then on."""
    return sum(
        1
        for peer in peers
        if peer["alive"]
        for pattern, _name, mode in peer["subscriptions"]
        if mode == "ephemeral" and matcher(pattern)(topic)
    )


def _view(peers: list[dict[str, Any]]) -> frozenset[tuple[str, str]]:
    return frozenset((p["id"], repr(p["subscriptions"])) for p in peers if p["alive"])


def serving_groups(status: dict[str, Any], topic: str) -> set[str]:
    """The groups of ``topic`` with a member the node knows: its lanes of the topic with
    one, and the groups live peers subscribe by a pattern matching it (whose lanes are
    made at the topic's first message)."""
    groups = {ln["group"] for ln in status["lanes"] if ln["topic"] == topic and ln["members"]}
    for peer in status["peers"]:
        if peer["alive"]:
            groups.update(
                name
                for pattern, name, mode in peer["subscriptions"]
                if mode != "ephemeral" and matcher(pattern)(topic)
            )
    return groups


def not_served(status: dict[str, Any], topic: str, wanted: int, waited_s: float) -> str:
    """What a pub that did not find members of ``wanted`` groups of ``topic`` says: the
    groups it found, or that it found none (its messages are kept for the first group
    to come) and what the peers it met consume (a misspelled topic shows there)."""
    found = sorted(serving_groups(status, topic))
    if found:
        return (
            f"members of {wanted} groups consuming {topic} not found within {waited_s:g}s; "
            f"publishing for those found: {', '.join(found)}"
        )
    consumed = sorted(
        {
            pattern
            for peer in status["peers"]
            if peer["alive"]
            for pattern, _name, _mode in peer["subscriptions"]
        }
    )
    said = (
        f"no group consuming {topic} found within {waited_s:g}s: its messages are kept "
        "for the first group that subscribes"
    )
    if consumed:
        shown = ", ".join(consumed[:10]) + (", ..." if len(consumed) > 10 else "")
        said += f" (the peers found consume: {shown})"
    elif not status["peers"]:
        said += (
            " (no peer found: check --mesh, --seed, --interface and, for a secured mesh, "
            "--secret-key-file)"
        )
    return said


def wait_settled(node: Node, wait_s: float, signals: StopSignals) -> None:
    """Wait until the live peers the node knows, and their subscriptions, stayed the same
    for two heartbeats (up to ``wait_s``): the members hear of this node by gossip, in
    rounds a fraction of a heartbeat apart, and each says hello to it once it does, so
    the members found by then are all there is to ask."""
    quiet_s = 2 * node.config.heartbeat_interval_s
    deadline = time.monotonic() + wait_s
    view, since = None, time.monotonic()
    while not signals.stop.is_set():
        seen = _view(node.status()["peers"])
        now = time.monotonic()
        if seen != view:
            view, since = seen, now
        elif now - since >= quiet_s or now >= deadline:
            return
        signals.stop.wait(SERVING_POLL_S)


def wait_serving(
    node: Node, topic: str, wait_s: float, signals: StopSignals, groups: int = 1
) -> bool:
    """Wait (up to ``wait_s``) until peers of ``groups`` groups that consume ``topic`` have
    said hello: lanes of the topic with a member. With ``groups`` 1, also until an
    ephemeral subscriber of the topic is known, no group's member being (once the peers
    known stopped changing for SETTLE_S, or at ``wait_s``).

    A message is owed to the groups its producer knows when it is stored (see
    Node.publish); one stored for none is owed to the first group learned. So a message
    published for an ephemeral subscriber is still owed to a group found a moment later,
    but, with two groups wanted, one of the second group found later would not be."""
    deadline = time.monotonic() + wait_s
    view: frozenset[tuple[str, str]] | None = None
    since = time.monotonic()
    while not signals.stop.is_set():
        status = node.status()
        serving = serving_groups(status, topic)
        if len(serving) >= groups:
            return True
        now = time.monotonic()
        ephemeral = (
            groups == 1 and not serving and ephemeral_subscribers(status["peers"], topic) > 0
        )
        if ephemeral:
            seen = _view(status["peers"])
            if seen != view:
                view, since = seen, now
            elif now - since >= SETTLE_S:
                return True
        if now >= deadline:
            return ephemeral
        signals.stop.wait(SERVING_POLL_S)
    return False


def owed_to_no_group(receipts: list[Receipt], signals: StopSignals) -> bool:
    """Whether the messages were stored owed to no group (their topic had none when they
    were stored, and none claimed them since): no ack will come for them. False when a
    stop signal comes first.

    Asked of the last message alone: a group known when an earlier one was stored is
    owed the last one too, and one learned since claims them all. (Asking a receipt
    starts the tracking of its acks, and the receipts of a repeated --msg-id share one
    message: its first receipt is told its ack only when asked after the duplicates'
    receipts, as settle() then asks them, the last one first.)"""
    last = receipts[-1]
    while not last.stored:
        if signals.stop.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            last.wait_stored(STORED_CHECK_S)
    return not last.outcomes
