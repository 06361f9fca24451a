"""Latest-wins by key: an offline group gets the latest value per key."""

from __future__ import annotations

import zmesh
from tests.conftest import wait_until
from tests.integration.test_delivery import drain


def test_offline_group_gets_only_the_latest_value_per_key(make_node, tmp_path):
    topic = zmesh.TopicConfig(latest_wins=True, groups=("dash",))
    prod = make_node("prod", topics={"prices": topic})
    for round_ in range(5):
        for sym in ("AAA", "BBB", "CCC"):
            prod.publish("prices", f"{sym}={round_}".encode(), key=sym)
    prod.publish("prices", b"no key 1")
    prod.publish("prices", b"no key 2")
    wait_until(lambda: prod.status()["outbox"] == 5, what="superseded messages to leave")
    # Across a restart the key index is rebuilt: a newer value still replaces the old one.
    prod.close()
    prod = make_node("prod", data_dir=str(tmp_path / "prod"), topics={"prices": topic})
    prod.publish("prices", b"AAA=9", key="AAA").wait_stored(5)
    wait_until(lambda: prod.status()["outbox"] == 5, what="AAA=4 replaced by AAA=9")
    cons = make_node("cons", seeds=[prod.control_address])
    got = sorted(m.payload for m in drain(cons.subscribe("prices", group="dash"), 5))
    assert got == [b"AAA=9", b"BBB=4", b"CCC=4", b"no key 1", b"no key 2"]
    [lane] = [ln for ln in prod.status()["lanes"] if ln["lane"] == "dash"]
    assert lane["superseded"] == 1  # this incarnation replaced one
    assert cons.subscribe("prices", group="other").get(timeout=0.3) is None
