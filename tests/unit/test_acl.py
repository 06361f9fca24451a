"""The ACL file: topic patterns, names of keys and groups, and the errors it can hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from zmesh._acl import Acl, covers
from zmesh.errors import ConfigError


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("metrics", "metrics", True),
        ("metrics", "metrics.cpu", False),
        ("metrics.*", "metrics.cpu", True),
        ("metrics.*", "metrics.cpu.user", False),
        ("metrics.>", "metrics.cpu.user", True),
        ("metrics.>", "metrics", False),
        (">", "anything.at.all", True),
        ("*.cpu", "host1.cpu", True),
        ("*.cpu", "host1.mem", False),
        # A subscription that is a pattern needs a grant covering all it can match.
        ("metrics.*", "metrics.*", True),
        ("metrics.>", "metrics.*", True),
        ("metrics.cpu", "metrics.*", False),
        ("metrics.*", "metrics.>", False),
        ("metrics.>", "metrics.>", True),
    ],
)
def test_covers(pattern: str, topic: str, expected: bool) -> None:
    assert covers(pattern, topic) is expected


def _keys(tmp_path: Path, *names: str) -> dict[str, bytes]:
    d = tmp_path / "trusted"
    d.mkdir(exist_ok=True)
    out = {}
    for name in names:
        public, _secret = zmq.curve_keypair()
        (d / f"{name}.pub").write_text(public.decode() + "\n")
        out[name] = public
    return out


def test_an_acl_grants_by_group_name_and_key(tmp_path: Path) -> None:
    keys = _keys(tmp_path, "s1", "s2", "agg", "alice")
    raw = zmq.curve_keypair()[0]
    acl_file = tmp_path / "acl.toml"
    acl_file.write_text(f"""
[groups]
sensors = ["s1", "s2"]
all = ["sensors", "agg"]

[[allow]]
who = ["sensors", "{raw.decode()}"]
publish = ["metrics.>"]

[[allow]]
who = ["agg"]
subscribe = ["metrics.*"]
publish = ["alerts"]

[[allow]]
who = ["alice"]
admin = ["*"]

[[allow]]
who = ["all"]
subscribe = ["hello"]
""")
    acl = Acl.load(str(acl_file), str(tmp_path / "trusted"))
    assert acl.may(keys["s1"], "publish", "metrics.cpu.user")
    assert acl.may(raw, "publish", "metrics.x")
    assert not acl.may(keys["s1"], "subscribe", "metrics.cpu")
    assert acl.may(keys["s2"], "subscribe", "hello")
    assert acl.may(keys["agg"], "subscribe", "metrics.cpu")
    assert not acl.may(keys["agg"], "subscribe", "metrics.cpu.user")
    assert acl.may(keys["agg"], "publish", "alerts")
    assert acl.may(keys["alice"], "admin", "dlq") and not acl.may(keys["agg"], "admin", "status")
    assert not acl.may(zmq.curve_keypair()[0], "subscribe", "hello")  # not named: nothing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[allow]]\nwho = ['nobody']\n", "'nobody' is neither a group, nor a key's name"),
        ("[[allow]]\npublish = ['x']\n", "has who (required)"),
        ("[[allow]]\nwho = ['s1']\npublish = ['a.>.b']\n", "'a.>.b' is not a topic pattern"),
        ("[[allow]]\nwho = ['s1']\npublish = ['a*']\n", "'a*' is not a topic pattern"),
        ("[[allow]]\nwho = ['s1']\nadmin = ['root']\n", "unknown right(s) ['root']"),
        ("[groups]\nloop = ['loop']\n[[allow]]\nwho = ['loop']\n", "contains itself"),
        ("[users]\n", "unknown table(s) ['users']"),
        ("[[allow]\n", "invalid TOML"),
        ("[[allow]]\nwho = 's1'\n", "must be a list of strings"),
    ],
)
def test_a_bad_acl_file_names_itself_and_the_entry(tmp_path: Path, text: str, message: str) -> None:
    _keys(tmp_path, "s1")
    acl_file = tmp_path / "acl.toml"
    acl_file.write_text(text)
    with pytest.raises(ConfigError) as err:
        Acl.load(str(acl_file), str(tmp_path / "trusted"))
    assert str(acl_file) in str(err.value) and message in str(err.value)
