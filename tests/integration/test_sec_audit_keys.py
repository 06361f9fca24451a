"""Key files at their edges and trusted keys changed at run time, with real nodes: a key
that is not one is a ConfigError at the start and a reload refused at run time, a public
key given as the secret one is refused, a secret key others may read is warned of, and a
key revoked then trusted again lets its node back."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest

import zmesh
from tests.conftest import wait_members, wait_until
from zmesh._security import generate_keypair

# Five Z85 characters past 2**32: each character is Z85, the key is none.
PAST_Z85 = "#" * 40


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    d = tmp_path / "trusted"
    for name in ("prod", "cons"):
        generate_keypair(d, name)
    return d


def secured(keys: Path, name: str, trusted: Path | None = None) -> dict:
    return dict(secret_key_file=str(keys / f"{name}.key"), trusted_keys_dir=str(trusted or keys))


def take(sub: zmesh.Subscription, got: list[bytes]) -> int:
    for m in sub.fetch(1000, timeout=0.05):
        got.append(bytes(m.payload))
        m.ack()
    return len(got)


def test_a_key_past_z85s_range_is_a_config_error_and_a_running_node_keeps_its_keys(
    make_node, keys, caplog
):
    caplog.set_level(logging.ERROR, logger="zmesh._engine.guard")
    prod = make_node("prod", **secured(keys, "prod"))
    # Dropped into trusted_keys_dir at run time: the reload that met it stopped the
    # node's IO thread (struct.error, not a ConfigError).
    (keys / "bad.pub").write_text(PAST_Z85 + "\n")
    wait_until(lambda: "bad.pub: not a Z85 key" in caplog.text, what="the bad key seen")
    prod.publish("t", b"still running").wait_stored(5)
    with pytest.raises(zmesh.ConfigError, match=r"bad.pub: not a Z85 key"):
        make_node("cons", **secured(keys, "cons"))
    with pytest.raises(zmesh.ConfigError, match=r"trusted_keys\[0\]: not a Z85 key"):
        make_node("other", trusted_keys=(PAST_Z85,), secret_key_file=str(keys / "cons.key"))


def test_a_bad_character_in_a_key_is_named(make_node, keys):
    (keys / "cons.key").write_text("é" * 40 + "\n")
    with pytest.raises(zmesh.ConfigError) as err:
        make_node("cons", **secured(keys, "cons"))
    # (it said "got 80" of a 40-character text, and "not a Z85 key: 195" of others)
    assert "'é' is not a Z85 character" in str(err.value), err.value


def test_a_public_key_given_as_the_secret_key_is_refused(make_node, keys, tmp_path):
    # NAME.pub copied over NAME.key: the node ran under a key derived from it, which no
    # peer trusts, and every peer refused it as a stranger.
    shutil.copy(keys / "cons.pub", keys / "cons.key")
    with pytest.raises(zmesh.ConfigError, match=r"cons.key holds a key the node trusts"):
        make_node("cons", **secured(keys, "cons"))
    # The same with no .pub of it trusted, but a NAME.pub beside it.
    alone = tmp_path / "alone"
    generate_keypair(alone, "n")
    shutil.copy(alone / "n.pub", alone / "n.key")
    with pytest.raises(zmesh.ConfigError, match=r"n.key is not the secret key of n.pub"):
        make_node("n", secret_key_file=str(alone / "n.key"), trusted_keys_dir=str(keys))


def test_a_secret_key_others_may_read_is_warned_of(make_node, keys, caplog):
    caplog.set_level(logging.WARNING, logger="zmesh._security")
    make_node("prod", **secured(keys, "prod"))
    assert "may be read by others" not in caplog.text  # (0600, as generated)
    os.chmod(keys / "cons.key", 0o644)
    make_node("cons", **secured(keys, "cons"))
    assert "cons.key may be read by others than its owner (mode 644)" in caplog.text


def test_a_key_revoked_then_trusted_again_lets_its_node_back(make_node, keys, tmp_path):
    # Its node's sockets were refused while its key was revoked, and ZeroMQ does not
    # connect again after a refusal: the two nodes stayed apart for FORGET_DEAD_AFTER_S
    # (600 s), each holding the other dead.
    only = tmp_path / "prod-trusts"
    only.mkdir()
    for name in ("prod", "cons"):
        shutil.copy(keys / f"{name}.pub", only)
    prod = make_node("prod", **secured(keys, "prod", only))
    cons = make_node("cons", seeds=[prod.control_address], **secured(keys, "cons"))
    to_cons = cons.subscribe("t", group="g")
    to_prod = prod.subscribe("u", group="h")
    wait_members(prod, "t", "g", 1)
    wait_members(cons, "u", "h", 1)
    (only / "cons.pub").unlink()
    wait_until(
        lambda: (
            all(p["id"] != cons.id for p in prod.status()["peers"])
            and all(not p["alive"] for p in cons.status()["peers"])
        ),
        what="cons revoked, and prod dead to it",
    )
    shutil.copy(keys / "cons.pub", only)
    start = time.monotonic()
    prod.publish("t", b"to cons")
    cons.publish("u", b"to prod")
    got_cons: list[bytes] = []
    got_prod: list[bytes] = []
    wait_until(
        lambda: take(to_cons, got_cons) >= 1 and take(to_prod, got_prod) >= 1,
        what="both ways again once trusted again",
    )
    assert got_cons == [b"to cons"] and got_prod == [b"to prod"]
    assert time.monotonic() - start < 10
