"""Which member of a shared lane receives each partition, and partitions handed over in order.

The assignment is balanced and sticky (``routing.assign``): it changes when a member joins
or leaves, and then only as much as balance needs. A partition that moves from a member
that is still here, while that member holds messages of it in flight, is *fenced*: nobody
is handed its messages until those in flight are settled (acked, nacked, timed out), so
the new member gets the partition's next messages only after the old one is done with
the earlier ones, and one key's messages are handled in order across the move. A member
that leaves holds nothing (its in-flight messages are ready again at once), so its
partitions move with no fence.

Each partition also has a *home*: the member it belongs to while that member is here. A
partition that moves because its member is gone keeps its home, and goes back there when
the member does (``routing.assign``). Homes are kept in the lane's record, which the
producer's replicas copy: a producer restarted, or a replica taking its lanes over,
starts from them. So a message in flight when its member seemed gone (the producer cut
off, or restarted, or taken over) is sent again to the member that may have handled it,
which drops it by its dedupe window, not to another member. The balance is worked out
when the table is next needed, not at each join or leave, so members learned of at once
are balanced in one step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from ..routing import assign

# (sequence, partition) of each message in flight to one member
Held = Callable[[bytes], Iterable[tuple[int, int]]]


class Assignment:
    """A lane's partitions to its members: the assignment and its fences."""

    __slots__ = (
        "producer",
        "assigned",
        "_members",
        "_held",
        "_stale",
        "_fences",
        "_table",
        "_moved",
        "home",
        "version",
    )

    def __init__(
        self, producer: bytes, partitions: int, members: Collection[bytes], held: Held
    ) -> None:
        self.producer = producer
        self.assigned: list[bytes | None] = [None] * partitions
        self._members = members  # (the lane's, live)
        self._held = held
        self._stale = False  # the members changed since the table was balanced
        # partition -> (the member that still holds some of it, their sequences, ascending)
        self._fences: dict[int, tuple[bytes, list[int]]] = {}
        self._table: list[bytes | None] | None = None
        self._moved = 0  # partitions that changed member since the lane was made
        self.home: list[bytes | None] = [None] * partitions  # (see the module)
        self.version = 0  # bumped when ``home`` changes

    def seed(self, home: Sequence[bytes]) -> None:
        """Start from the homes kept before (the lane's record)."""
        partitions = len(self.assigned)
        self.home = [*home[:partitions], *[None] * (partitions - len(home))]
        self.assigned = list(self.home)
        self._stale = True
        self._table = None

    @property
    def fenced(self) -> bool:
        self._balance()
        return bool(self._fences)

    def table(self) -> list[bytes | None]:
        """The member each partition's ready messages go to now (None: nobody, fenced)."""
        self._balance()
        table = self._table
        if table is None:
            table = list(self.assigned)
            for partition in self._fences:
                table[partition] = None
            self._table = table
        return table

    @property
    def moved(self) -> int:
        """Partitions that changed member since the lane was made."""
        self._balance()
        return self._moved

    def owned_by(self, member: bytes) -> list[int]:
        self._balance()
        return [p for p, m in enumerate(self.assigned) if m == member]

    def change(self) -> None:
        """The members changed: balanced again when the table is next needed."""
        self._stale = True
        self._table = None

    def _balance(self) -> None:
        """Balance again if the members changed; fence what moves away from a member still
        here while it holds some of it in flight (``held(member)``, asked once per
        member)."""
        if not self._stale:
            return
        self._stale = False
        members = self._members
        before = self.assigned
        home = self.home
        after = assign(before, members, self.producer, home)
        self.assigned = after
        if members:
            for partition, (belongs, new) in enumerate(zip(home, after, strict=True)):
                if belongs != new and (belongs is None or belongs in members):
                    home[partition] = new
                    self.version += 1
        holding: dict[bytes, dict[int, list[int]]] = {}
        for partition, (old, new) in enumerate(zip(before, after, strict=True)):
            if old == new:
                continue
            if old is not None:
                self._moved += 1
            fence = self._fences.get(partition)
            if fence is not None and fence[0] == new:
                del self._fences[partition]  # back to the member that holds it: in order
                continue
            if old is None or old not in members or fence is not None:
                continue  # (a fence stays until its holder is done)
            by_partition = holding.get(old)
            if by_partition is None:
                by_partition = holding[old] = {}
                for seq, p in self._held(old):
                    by_partition.setdefault(p, []).append(seq)
            seqs = by_partition.get(partition)
            if seqs:
                self._fences[partition] = (old, sorted(seqs))

    def leave(self, member: bytes) -> None:
        """``member`` left: what it held is ready again, its fences go; balanced again."""
        gone = [p for p, (holder, _seqs) in self._fences.items() if holder == member]
        for partition in gone:
            del self._fences[partition]
        self.change()

    def grow(self, partitions: int) -> None:
        self.assigned.extend([None] * (partitions - len(self.assigned)))
        self.home.extend([None] * (partitions - len(self.home)))
        self.change()

    def release(self, in_flight: Callable[[int], bool]) -> bool:
        """Lift the fences whose messages are all settled (each one looked at once after it
        is: an ack of the oldest, mostly, lifts it); True when one was lifted."""
        lifted = False
        for partition, (_holder, seqs) in list(self._fences.items()):
            done = 0
            for seq in seqs:
                if in_flight(seq):
                    break
                done += 1
            if done == len(seqs):
                del self._fences[partition]
                lifted = True
            elif done:
                del seqs[:done]
        if lifted:
            self._table = None
        return lifted
