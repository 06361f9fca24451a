"""Data dirs move forward: this release reads what an earlier one wrote, and refuses a
store of a later format than its own.

``tests/fixtures/upgrade_4830667`` holds data dirs an earlier release wrote (its README
says which and how): a producer owing group g1 messages stored alone and as runs (their
columns as lists), two of them nacked, one dead letter, latest-wins and scheduled
messages; a copy of that producer from before its consumer acked five messages; the
consumer, whose dedupe window holds those five.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import lmdb
import pytest

import zmesh
from tests.conftest import wait_members, wait_until
from zmesh._store.format import FORMAT, KEY

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade_4830667"
# (never expiring: the fixture's groups have been without members since it was written)
TOPICS = {
    "orders": zmesh.TopicConfig(group_inactive_expiry_s=0),
    "metrics": zmesh.TopicConfig(group_inactive_expiry_s=0),
    "latest": zmesh.TopicConfig(latest_wins=True, group_inactive_expiry_s=0),
}


def _received(subs: list[zmesh.Subscription], want: int) -> list[zmesh.Message]:
    """Every message ``subs`` get, acked: ``want`` of them, and any that come within a
    second more (one delivered twice)."""
    got: list[zmesh.Message] = []

    def take(timeout: float) -> bool:
        for sub in subs:
            for msg in sub.fetch(100, timeout=timeout):
                msg.ack()
                got.append(msg)
        return len(got) >= want

    wait_until(lambda: take(0.05), timeout=20, what=f"{want} messages")
    take(1.0 / len(subs))
    return got


def test_an_earlier_release_s_data_dirs_deliver_what_they_held(make_node, tmp_path):
    for name in ("prod", "prod_early", "cons"):
        shutil.copytree(FIXTURE / name, tmp_path / name)
    expected = json.loads((FIXTURE / "expect.json").read_text())
    prod = make_node("prod", topics=TOPICS)
    cons = make_node("cons", seeds=[prod.control_address])
    subs = [cons.subscribe(topic, group="g1") for topic in TOPICS]
    got = _received(subs, len(expected["expect"]))

    seen = Counter(
        (m.topic, m.payload.decode(), m.key, json.dumps(m.headers or None, sort_keys=True))
        for m in got
    )
    want = Counter((t, p, k, json.dumps(h, sort_keys=True)) for t, p, k, h in expected["expect"])
    assert seen == want  # each pending message once, intact; nothing settled comes again
    attempts = {m.payload.decode(): m.attempt for m in got}
    assert {p: attempts[p] for p in expected["attempts"]} == expected["attempts"]
    [dead] = prod.dead_letters("orders", "g1")
    assert (dead.payload.decode(), dead.reason, dead.attempts) == ("d0", "bad d0", 1)
    assert prod.replay_dead_letters("orders", "g1") == 1
    [again] = _received(subs[:1], 1)
    assert again.payload == b"d0" and again.id == dead.id
    wait_until(lambda: prod.status()["outbox"] == 0, what="the outbox drained")
    stats = prod.stats()
    assert not any(stats.get(k) for k in ("corrupt_records", "lost_records", "unreadable_records"))
    for sub in subs:
        sub.close()
    prod.close()

    # The early copy owes five messages the consumer acked: its dedupe window drops them.
    early = make_node("prod", data_dir=str(tmp_path / "prod_early"), topics=TOPICS)
    cons.close()
    cons = make_node("cons", seeds=[early.control_address])
    sub = cons.subscribe("orders", group="g1")
    wait_members(early, "orders", "g1", 1)
    wait_until(lambda: early.status()["outbox"] == 0, what="the early copy drained")
    assert cons.stats().get("duplicates_dropped") == 5
    assert sub.fetch(10, timeout=0.3) == []


def test_a_store_of_a_later_format_is_refused_at_open(make_node, tmp_path):
    node = make_node("n")
    node.close()
    env = lmdb.open(str(tmp_path / "n" / "store"), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(KEY, (FORMAT + 1).to_bytes(4, "big"))
    env.close()
    with pytest.raises(zmesh.StoreError, match=r"written by a later zmesh release") as err:
        make_node("n")
    assert str(tmp_path / "n") in str(err.value)
    assert f"store format {FORMAT + 1}; this release reads up to {FORMAT}" in str(err.value)
