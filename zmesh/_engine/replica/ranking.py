"""Who holds a producer's replicas, and who takes over its lanes: pure rules, with the
clock passed in.

Every node ranks the candidates for one producer alike, by rendezvous hashing of
(candidate, producer): the producer keeps the replicas it chose while they live and fills
a place that falls free with the best candidate left, on another host than its own
first (``replica_order``). When the producer has been silent for the take-over delay,
the live holders of a whole copy of its outbox agree on one of them without asking each
other (``taker``): the freshest copy (the producer's latest incarnation, then its latest
replica set), then the rendezvous order, so a copy the producer dropped takes over only
when no current one is alive.
"""

from __future__ import annotations

from _blake2 import blake2b  # (hashlib's own, without OpenSSL: 3.5 MB)
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class Candidate(NamedTuple):
    """A replica host as the producer sees it: its id and the host it speaks from."""

    node_id: bytes
    host: str


class Holder(NamedTuple):
    """A live node holding a whole copy of a producer's outbox, and how fresh it is: the
    producer's incarnation and replica-set version the copy last heard of."""

    node_id: bytes
    incarnation: int
    version: int


def score(candidate: bytes, producer: bytes) -> bytes:
    """The rendezvous weight of ``candidate`` for ``producer`` (higher ranks first)."""
    return blake2b(candidate + producer + b"replica", digest_size=8).digest()


def replica_order(
    candidates: Iterable[Candidate], producer: bytes, own_hosts: Sequence[str]
) -> list[bytes]:
    """``candidates`` best first: by rendezvous weight, one per host on hosts other than
    the producer's (``own_hosts``) first, then the others in weight order."""
    ranked = sorted(candidates, key=lambda c: score(c.node_id, producer), reverse=True)
    first: list[bytes] = []
    used: set[str] = set(own_hosts)
    for c in ranked:
        if c.host not in used:
            first.append(c.node_id)
            used.add(c.host)
    chosen = set(first)
    return first + [c.node_id for c in ranked if c.node_id not in chosen]


def taker(holders: Iterable[Holder], producer: bytes) -> bytes | None:
    """The holder that takes over ``producer``'s lanes: the freshest copy, then the best
    by rendezvous weight; None when there is no holder."""
    best = max(
        holders,
        key=lambda h: (h.incarnation, h.version, score(h.node_id, producer)),
        default=None,
    )
    return None if best is None else best.node_id


def outranks(a: Holder, b: Holder, producer: bytes) -> bool:
    """Whether ``a`` comes before ``b`` for ``producer`` (two nodes that both took over:
    the other one gives way)."""
    return taker((a, b), producer) == a.node_id


def takes_over(
    now: float,
    silent_since: float,
    delay_s: float,
    me: bytes,
    holders: Iterable[Holder],
    producer: bytes,
    served: bool,
) -> bool:
    """Whether this node (``me``, among ``holders``) takes over ``producer``'s lanes now:
    the producer has been silent since ``silent_since`` for ``delay_s`` or more, no live
    node serves them already (``served``), and this node is the one every holder picks."""
    if served or now - silent_since < delay_s:
        return False
    return taker(holders, producer) == me
