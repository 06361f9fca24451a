"""Configuration objects: what builds, what is refused and how the refusal reads."""

from __future__ import annotations

import dataclasses
import math
import threading
from pathlib import Path
from typing import Any

import pytest

import zmesh
from zmesh import (
    ConfigError,
    NodeConfig,
    ProducerConfig,
    RelayConfig,
    SubscriptionConfig,
    TopicConfig,
)
from zmesh._discovery.static import seed_endpoints
from zmesh.config import parse_seed

NAN = float("nan")


def node(**kw: Any) -> NodeConfig:
    kw.setdefault("name", "n1")
    kw.setdefault("data_dir", "var/n1")
    return NodeConfig(**kw)


# -- valid ----------------------------------------------------------------------------------


def test_topic_config_defaults() -> None:
    cfg = TopicConfig()
    assert cfg.durability == "process"
    assert cfg.partitions == 16
    assert cfg.max_attempts == 0
    assert cfg.ttl_s is None
    assert cfg.groups == ()
    assert cfg.retention_s == 0 and cfg.retention_bytes == 0


def test_topic_config_full() -> None:
    cfg = TopicConfig(
        durability="fsync",
        partitions=1,
        ack_timeout_s=2,
        retry_backoff_s=0,
        max_retry_backoff_s=0,
        max_attempts=5,
        ttl_s=60.0,
        groups=["agg", "pager"],
        retention_s=3600.0,
        retention_bytes=1 << 30,
    )  # type: ignore[arg-type]
    assert cfg.partitions == 1
    assert cfg.retention_s == 3600.0 and cfg.retention_bytes == 1 << 30
    assert cfg.groups == ("agg", "pager")
    assert TopicConfig(partitions=4096).partitions == 4096
    for durability in ("fsync", "process", "memory"):
        assert TopicConfig(durability=durability).durability == durability  # type: ignore[arg-type]


def test_subscription_config() -> None:
    cfg = SubscriptionConfig(group="agg")
    assert (cfg.mode, cfg.max_in_flight, cfg.batch_size, cfg.concurrency) == (
        "shared",
        8000,
        1000,
        1,
    )
    cfg = SubscriptionConfig(
        group="a.b_c-1", mode="broadcast", max_in_flight=1, batch_size=1, concurrency=8
    )
    assert cfg.mode == "broadcast"


def test_node_config_defaults_and_normalisation(tmp_path: Path) -> None:
    cfg = node(
        data_dir=tmp_path,
        interfaces=["127.0.0.1"],
        seeds=["10.0.0.2:5000"],
        topics={"metrics": TopicConfig(partitions=4)},
    )
    assert cfg.mesh == "default"
    assert cfg.data_dir == str(tmp_path) and isinstance(cfg.data_dir, str)
    assert cfg.interfaces == ("127.0.0.1",)
    assert cfg.seeds == ("10.0.0.2:5000",)
    assert cfg.mdns is True
    assert cfg.topics["metrics"].partitions == 4
    assert cfg.max_map_size_bytes == 0  # never grow the map unless asked


def test_node_config_accepts_edge_values() -> None:
    cfg = node(
        name="a" * 128,
        mesh="0",
        publish_timeout_s=0,
        memory_budget_bytes=0,
        heartbeat_interval_s=0.1,
        dead_after_s=0.2,
        max_message_bytes=1,
        map_size_bytes=1 << 20,
        max_map_size_bytes=1 << 20,  # equal: allowed, the map just never grows
        seeds=["10.0.0.2:65535", "host.example:1", "tcp://db_2.local.:80"],
        interfaces=["127.0.0.1", "10.0.0.12"],
        dedupe_window_s=math.inf,  # (remembered for good)
    )
    assert cfg.publish_timeout_s == 0
    assert node(interfaces=["0.0.0.0"]).interfaces == ("0.0.0.0",)
    assert node(interfaces=["*"], mdns=False).interfaces == ("*",)
    assert node(data_dir=Path("var") / "n1").data_dir == str(Path("var") / "n1")
    # Infinity where it means "never": no ack deadline, no expiry, no age limit.
    cfg_inf = TopicConfig(ack_timeout_s=math.inf, ttl_s=math.inf, retention_s=math.inf)
    assert cfg_inf.ack_timeout_s == math.inf
    assert TopicConfig(retry_backoff_s=2, max_retry_backoff_s=2).retry_backoff_s == 2


def test_configs_are_frozen_and_keyword_only() -> None:
    cfg = node()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TopicConfig().partitions = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        TopicConfig("fsync")  # type: ignore[misc]
    with pytest.raises(TypeError):
        SubscriptionConfig("agg")  # type: ignore[misc]


def test_node_config_topics_are_copied() -> None:
    topics = {"metrics": TopicConfig()}
    cfg = node(topics=topics)
    topics["alerts"] = TopicConfig()
    assert set(cfg.topics) == {"metrics"}


def test_replace_validates_again() -> None:
    cfg = node(heartbeat_interval_s=1.0, dead_after_s=5.0)
    assert cfg.replace(dead_after_s=3.0).dead_after_s == 3.0
    assert cfg.dead_after_s == 5.0
    with pytest.raises(ConfigError, match="dead_after_s"):
        cfg.replace(dead_after_s=0.5)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        TopicConfig(partitions=0)


# -- invalid values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("durability", "disk", "TopicConfig.durability"),
        ("durability", None, "TopicConfig.durability"),
        ("partitions", 0, "TopicConfig.partitions"),
        ("partitions", 4097, "TopicConfig.partitions"),
        ("partitions", -1, "TopicConfig.partitions"),
        ("partitions", 1.5, "TopicConfig.partitions"),
        ("partitions", True, "TopicConfig.partitions"),
        ("partitions", "16", "TopicConfig.partitions"),
        ("ack_timeout_s", 0, "TopicConfig.ack_timeout_s"),
        ("ack_timeout_s", -1.0, "TopicConfig.ack_timeout_s"),
        ("ack_timeout_s", "30", "TopicConfig.ack_timeout_s"),
        ("ack_timeout_s", True, "TopicConfig.ack_timeout_s"),
        ("ack_timeout_s", None, "TopicConfig.ack_timeout_s"),
        ("retry_backoff_s", -0.1, "TopicConfig.retry_backoff_s"),
        ("retry_backoff_s", "fast", "TopicConfig.retry_backoff_s"),
        ("max_retry_backoff_s", -1, "TopicConfig.max_retry_backoff_s"),
        # An infinite backoff never redelivers a nacked or timed-out message.
        ("retry_backoff_s", math.inf, "TopicConfig.retry_backoff_s must be a finite"),
        ("max_retry_backoff_s", math.inf, "TopicConfig.max_retry_backoff_s must be a finite"),
        # (above the default max_retry_backoff_s of 30)
        ("retry_backoff_s", 31, "retry_backoff_s (31) must be at most max_retry_backoff_s"),
        ("max_attempts", -1, "TopicConfig.max_attempts"),
        ("max_attempts", 1.5, "TopicConfig.max_attempts"),
        ("max_attempts", True, "TopicConfig.max_attempts"),
        ("ttl_s", 0, "TopicConfig.ttl_s"),
        ("ttl_s", -5.0, "TopicConfig.ttl_s"),
        ("ttl_s", "1h", "TopicConfig.ttl_s"),
        ("retention_s", -1, "TopicConfig.retention_s"),
        ("retention_s", "1d", "TopicConfig.retention_s"),
        ("retention_s", True, "TopicConfig.retention_s"),
        ("retention_s", None, "TopicConfig.retention_s"),
        ("retention_bytes", -1, "TopicConfig.retention_bytes"),
        ("retention_bytes", 1.5, "TopicConfig.retention_bytes"),
        ("retention_bytes", "1GB", "TopicConfig.retention_bytes"),
        ("retention_bytes", True, "TopicConfig.retention_bytes"),
        (
            "groups",
            "agg",
            "TopicConfig.groups must be a list of group names, not a string: ['agg']",
        ),
        ("groups", None, "TopicConfig.groups must be a list of group names, got None"),
        ("groups", 5, "TopicConfig.groups must be a list of group names, got 5"),
        ("groups", {"a": 1}, "TopicConfig.groups must be a list of group names, got {'a': 1}"),
        ("groups", {"a"}, "TopicConfig.groups must be a list of group names"),  # (no order)
        ("groups", ["ok", "not ok"], "group name"),
        ("groups", [""], "group name"),
        ("groups", [5], "group name 5 is invalid"),
    ],
)
def test_topic_config_rejects(field: str, value: object, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        TopicConfig(**{field: value})
    assert named in str(info.value)


@pytest.mark.parametrize(
    "field", ["ack_timeout_s", "retry_backoff_s", "max_retry_backoff_s", "ttl_s", "retention_s"]
)
def test_topic_config_rejects_nan(field: str) -> None:
    # NaN compares false with everything, so "< 0" and "== 0" let it through; a NaN
    # deadline never comes due and breaks the ordering of the lane's heaps.
    with pytest.raises(ConfigError) as info:
        TopicConfig(**{field: NAN})
    assert f"TopicConfig.{field}" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("group", "", "group name"),
        ("group", "a b", "group name"),
        ("group", "a/b", "group"),
        ("group", "g\n", "group name"),  # (a trailing newline: not the same name)
        ("group", "-lead", "group name"),
        ("group", "g" * 129, "group name"),
        ("group", 5, "group name"),
        ("mode", "fanout", "mode"),
        ("max_in_flight", 0, "SubscriptionConfig.max_in_flight"),
        # (without a group: ephemeral, but a misspelt mode is still refused)
        ("group", None, "subscription mode must be 'shared' or 'broadcast', got 'braodcast'"),
        ("max_in_flight", True, "SubscriptionConfig.max_in_flight"),
        ("max_in_flight", 2.0, "SubscriptionConfig.max_in_flight"),
        ("batch_size", 0, "SubscriptionConfig.batch_size"),
        ("batch_size", "10", "SubscriptionConfig.batch_size"),
        # past what a producer decodes in a hello (it would never know the member)
        ("batch_size", 10_001, "SubscriptionConfig.batch_size"),
        ("max_in_flight", (1 << 24) + 1, "SubscriptionConfig.max_in_flight"),
        ("concurrency", -1, "SubscriptionConfig.concurrency"),
        ("concurrency", 0, "SubscriptionConfig.concurrency"),
        ("concurrency", True, "SubscriptionConfig.concurrency"),
        # a thread each: 20,000 took seconds to start and to join, 100,000 hung
        ("concurrency", 1025, "SubscriptionConfig.concurrency must be an int 1..1,024"),
    ],
)
def test_subscription_config_rejects(field: str, value: object, named: str) -> None:
    kw: dict[str, Any] = {"group": "agg", field: value}
    if field == "group" and value is None:
        kw["mode"] = "braodcast"
    with pytest.raises(ConfigError) as info:
        SubscriptionConfig(**kw)
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("name", "", "node name"),
        ("name", "bad name", "node name"),
        ("name", "_hidden", "node name"),
        ("name", "n" * 129, "node name"),
        ("name", "a/b", "node name"),
        ("name", None, "node name"),
        ("mesh", "my mesh", "mesh name"),
        ("mesh", "", "mesh name"),
        ("data_dir", "", "NodeConfig.data_dir"),
        ("data_dir", 5, "NodeConfig.data_dir"),
        ("data_dir", None, "NodeConfig.data_dir"),
        ("data_dir", b"/x", "NodeConfig.data_dir must be a path"),  # was a dir "b'/x'"
        ("interfaces", "127.0.0.1", "interfaces must be a list of addresses, not a string"),
        ("interfaces", b"127.0.0.1", "interfaces must be a list of addresses, not a string"),
        ("seeds", "10.0.0.2:5000", "seeds must be a list of addresses, not a string"),
        # "" bound every interface; the others failed at the start with zmq's words
        ("interfaces", [""], "'' is not an IPv4 address"),
        ("interfaces", ["::1"], "'::1' is an IPv6 address; zmesh binds IPv4 only"),
        ("interfaces", ["[::1]"], "zmesh binds IPv4 only"),
        (
            "interfaces",
            ["127.0.0.1:5000"],
            "is not an IPv4 address; give this host's addresses without a port",
        ),
        ("interfaces", ["lo"], "'lo' is not an IPv4 address"),  # (mDNS takes addresses)
        ("interfaces", ["127.0.0.1", "127.0.0.1"], "names ['127.0.0.1'] more than once"),
        ("interfaces", ["0.0.0.0", "127.0.0.1"], "'0.0.0.0' binds every interface already"),
        ("interfaces", ["*"], "mDNS does not take '*'"),  # (with mdns on, the default)
        ("seeds", ["[::1]:5000"], "seed '[::1]:5000' is an IPv6 address"),
        ("seeds", ["::1:5000"], "zmesh binds IPv4 only"),
        ("seeds", ["tcp://[::1]:5000"], "zmesh binds IPv4 only"),
        ("seeds", ["10.0.0.2 :5000"], "'10.0.0.2 ' is neither a host name nor an IPv4"),
        ("seeds", ["my host:5000"], "neither a host name nor an IPv4 address"),
        ("seeds", ["host;rm:5000"], "neither a host name nor an IPv4 address"),
        ("seeds", ["10.0.0.256:5000"], "'10.0.0.256' is not an IPv4 address"),
        ("seeds", ["10.0.0.2"], "seed '10.0.0.2'"),
        ("seeds", ["10.0.0.2:0"], "seed '10.0.0.2:0'"),
        ("seeds", ["10.0.0.2:65536"], "seed '10.0.0.2:65536'"),
        ("seeds", ["10.0.0.2:http"], "seed '10.0.0.2:http'"),
        ("seeds", [":5000"], "seed ':5000'"),
        ("seeds", ["udp://10.0.0.2:5000"], "seed 'udp://10.0.0.2:5000'"),
        ("seeds", ["10.0.0.2/24:5000"], "seed '10.0.0.2/24:5000'"),
        ("heartbeat_interval_s", 0, "NodeConfig.heartbeat_interval_s"),
        ("heartbeat_interval_s", -1, "NodeConfig.heartbeat_interval_s"),
        ("heartbeat_interval_s", "1s", "NodeConfig.heartbeat_interval_s"),
        ("dead_after_s", 0, "NodeConfig.dead_after_s"),
        ("dead_after_s", 1.0, "NodeConfig.dead_after_s"),  # not longer than the heartbeat
        ("dead_after_s", 0.5, "NodeConfig.dead_after_s"),
        ("dead_after_s", math.inf, "NodeConfig.dead_after_s must be a finite"),
        ("max_outbox_messages", 0, "NodeConfig.max_outbox_messages"),
        ("max_outbox_messages", True, "NodeConfig.max_outbox_messages"),
        ("max_outbox_messages", 1.5, "NodeConfig.max_outbox_messages"),
        ("map_size_bytes", 0, "NodeConfig.map_size_bytes"),
        ("max_map_size_bytes", -1, "NodeConfig.max_map_size_bytes"),
        ("max_map_size_bytes", 1.5, "NodeConfig.max_map_size_bytes"),
        ("max_map_size_bytes", True, "NodeConfig.max_map_size_bytes"),
        ("max_map_size_bytes", "1G", "NodeConfig.max_map_size_bytes"),
        ("max_map_size_bytes", 1 << 20, "at least map_size_bytes"),  # below the 1 GiB default
        ("max_message_bytes", -1, "NodeConfig.max_message_bytes"),
        ("map_size_bytes", (1 << 20) - 4096, "at least 1048576 (1 MiB)"),
        # One message could take more than an eighth of the map: held for good, and every
        # publish after it. (1 GiB map by default.)
        ("max_message_bytes", (128 << 20) + 1, "at most an eighth of the LMDB map"),
        ("publish_timeout_s", -1, "NodeConfig.publish_timeout_s"),
        ("memory_budget_bytes", -1, "NodeConfig.memory_budget_bytes"),
        ("memory_budget_bytes", 1.5, "NodeConfig.memory_budget_bytes must be an int"),
        ("memory_budget_bytes", True, "NodeConfig.memory_budget_bytes must be an int"),
        ("drop_after_bad_frames", 1.5, "NodeConfig.drop_after_bad_frames must be an int >= 0"),
        (
            "ban_after_dropped_connections",
            -1,
            "NodeConfig.ban_after_dropped_connections must be an int >= 0",
        ),
        ("ban_duration_s", float("inf"), "NodeConfig.ban_duration_s must be a finite number"),
        ("ban_loopback", 1, "NodeConfig.ban_loopback must be true or false"),
        ("acl_file", "/etc/zmesh/acl.toml", "NodeConfig.acl_file needs secret_key_file"),
        ("acl_file", 5, "NodeConfig.acl_file must be a path (a str or os.PathLike), got 5"),
        ("secret_key_file", 5, "NodeConfig.secret_key_file must be a path (a str or os.Path"),
        ("secret_key_file", b"/k", "NodeConfig.secret_key_file must be a path"),
        ("trusted_keys_dir", 5, "NodeConfig.trusted_keys_dir must be a path"),
        ("trusted_keys", 5, "NodeConfig.trusted_keys must be a list of keys, got 5"),
        ("trusted_keys", None, "NodeConfig.trusted_keys must be a list of keys, got None"),
        ("trusted_keys", "k" * 40, "NodeConfig.trusted_keys must be a list of keys, not a str"),
        ("trusted_keys", {"k": 1}, "NodeConfig.trusted_keys must be a list of keys, got {"),
        ("trusted_keys", [5], "NodeConfig.trusted_keys holds public keys as Z85 strings, got 5"),
        ("trusted_keys", [b"k" * 40], "NodeConfig.trusted_keys holds public keys as Z85 str"),
        ("subscriptions", 5, "NodeConfig.subscriptions must be a list of SubscriptionConfig"),
        ("producers", 5, "NodeConfig.producers must be a list of ProducerConfig objects"),
        ("relays", None, "NodeConfig.relays must be a list of RelayConfig objects, got None"),
        ("dedupe_window_s", 0, "NodeConfig.dedupe_window_s"),
        ("data_dir", "/tmp/x\0y", "NodeConfig.data_dir must be a path, with no NUL"),
        ("acl_file", "a\0", "NodeConfig.acl_file must be a path, with no NUL"),
        # (TCP's retransmission bound is set from it in ms, an int32: it stopped the IO
        # thread at the first peer)
        ("dead_after_s", 3e6, "dead_after_s at most 86,400 s"),
        ("heartbeat_interval_s", 1e-6, "heartbeat_interval_s must be at least 0.01 s"),
        ("map_size_bytes", 10**30, "must be at most 1152921504606846976 (1 EiB)"),
        ("max_map_size_bytes", 2**70, "must be at most 1152921504606846976 (1 EiB)"),
        # (the pattern's replicas were dropped: node.topic() refuses the same)
        ("topics", {"plant.*": TopicConfig(replicas=2)}, "not for the pattern 'plant.*'"),
        (
            "relays",
            [
                RelayConfig(from_topic="a", to_topic="b", group="g1"),
                RelayConfig(from_topic="b", to_topic="a", group="g2"),
            ],
            "relays a -> b -> a republish each message for good",
        ),
        ("topics", {"bad name": TopicConfig()}, "topic name"),
        ("topics", {"metrics": {"partitions": 4}}, "NodeConfig.topics['metrics']"),
    ],
)
def test_node_config_rejects(field: str, value: object, named: str) -> None:
    kw: dict[str, Any] = {"heartbeat_interval_s": 1.0, field: value}
    if field == "acl_file" and "\0" in str(value):
        kw["secret_key_file"] = "k.key"
    with pytest.raises(ConfigError) as info:
        node(**kw)
    assert named in str(info.value)


def test_the_largest_message_is_bounded_by_the_largest_map() -> None:
    assert node(map_size_bytes=1 << 20, max_message_bytes=128 << 10).max_message_bytes == 128 << 10
    grown = node(map_size_bytes=1 << 20, max_map_size_bytes=64 << 20, max_message_bytes=8 << 20)
    assert grown.max_message_bytes == 8 << 20
    with pytest.raises(ConfigError, match="max_message_bytes .8388608. must be at most"):
        node(map_size_bytes=1 << 20)  # the default max_message_bytes needs a 64 MiB map


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mdns", "false"),  # a truthy string would switch multicast on
        ("mdns", 1),
        ("mdns", None),
        ("interfaces", None),
        ("interfaces", 5),
        ("interfaces", [1]),
        ("seeds", None),
        ("topics", 5),
        ("heartbeat_interval_s", NAN),
        ("dead_after_s", NAN),
        ("publish_timeout_s", NAN),
        ("dedupe_window_s", NAN),
    ],
)
def test_node_config_rejects_wrong_types(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        node(**{field: value})
    assert field in str(info.value)


# -- TOML -----------------------------------------------------------------------------------


GOOD_TOML = """
[node]
name = "sensor-1"
mesh = "plant"
data_dir = "var/sensor-1"
interfaces = ["127.0.0.1"]
mdns = false
seeds = ["10.0.0.2:5555", "10.0.0.3:5555"]
heartbeat_interval_s = 0.5
dead_after_s = 3
max_message_bytes = 1048576
map_size_bytes = 1048576
max_map_size_bytes = 8388608

[topics.metrics]
durability = "fsync"
partitions = 8
ack_timeout_s = 10.0
max_attempts = 5
ttl_s = 3600
retention_s = 86400
retention_bytes = 1073741824
groups = ["aggregators", "archive"]

[topics.alerts]
"""


def write(tmp_path: Path, text: str, name: str = "node.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_from_toml_good_file(tmp_path: Path) -> None:
    cfg = NodeConfig.from_toml(write(tmp_path, GOOD_TOML))
    assert cfg.name == "sensor-1" and cfg.mesh == "plant"
    assert cfg.data_dir == "var/sensor-1"
    assert cfg.interfaces == ("127.0.0.1",)
    assert cfg.mdns is False
    assert cfg.seeds == ("10.0.0.2:5555", "10.0.0.3:5555")
    assert cfg.heartbeat_interval_s == 0.5 and cfg.dead_after_s == 3
    assert cfg.max_message_bytes == 1 << 20
    assert (cfg.map_size_bytes, cfg.max_map_size_bytes) == (1 << 20, 8 << 20)
    assert set(cfg.topics) == {"metrics", "alerts"}
    metrics = cfg.topics["metrics"]
    assert metrics == TopicConfig(
        durability="fsync",
        partitions=8,
        ack_timeout_s=10.0,
        max_attempts=5,
        ttl_s=3600,
        retention_s=86400,
        retention_bytes=1 << 30,
        groups=("aggregators", "archive"),
    )
    assert cfg.topics["alerts"] == TopicConfig()


def test_from_toml_accepts_str_path(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML)
    assert NodeConfig.from_toml(str(path)) == NodeConfig.from_toml(path)


def test_from_toml_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "[node\nname = 'x'\n",
        "[node]\nname = sensor\n",
        "[node]\nname = 'a'\nname = 'b'\n",
    ],
)
def test_from_toml_invalid_toml(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert "invalid TOML" in message


def test_from_toml_unknown_table(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML + "\n[nodes]\nname = 'typo'\n")
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message and "nodes" in message


def test_from_toml_unknown_key_in_node(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML.replace("mdns = false", "mdns = false\nheartbeat_s = 1"))
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert "[node]" in message
    assert "heartbeat_s" in message
    assert "heartbeat_interval_s" in message  # the known keys are listed


def test_from_toml_unknown_key_in_topic(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML.replace("max_attempts = 5", "max_attempt = 5"))
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert "[topics.metrics]" in message
    assert "max_attempt" in message


@pytest.mark.parametrize(
    ("old", "new", "table", "key"),
    [
        (
            "heartbeat_interval_s = 0.5",
            "heartbeat_interval_s = 0",
            "[node]",
            "heartbeat_interval_s",
        ),
        ("dead_after_s = 3", "dead_after_s = 0.25", "[node]", "dead_after_s"),
        ('name = "sensor-1"', 'name = "sensor 1"', "[node]", "node name"),
        ('seeds = ["10.0.0.2:5555", "10.0.0.3:5555"]', 'seeds = ["10.0.0.2"]', "[node]", "seed"),
        ('interfaces = ["127.0.0.1"]', 'interfaces = "127.0.0.1"', "[node]", "interfaces"),
        ("max_message_bytes = 1048576", "max_message_bytes = 0", "[node]", "max_message_bytes"),
        (
            "max_map_size_bytes = 8388608",
            "max_map_size_bytes = 1024",
            "[node]",
            "max_map_size_bytes",
        ),
        ('durability = "fsync"', 'durability = "disk"', "[topics.metrics]", "durability"),
        ("partitions = 8", "partitions = 0", "[topics.metrics]", "partitions"),
        ("partitions = 8", 'partitions = "8"', "[topics.metrics]", "partitions"),
        ("ttl_s = 3600", "ttl_s = -1", "[topics.metrics]", "ttl_s"),
        ("retention_s = 86400", "retention_s = -1", "[topics.metrics]", "retention_s"),
        (
            "retention_bytes = 1073741824",
            'retention_bytes = "1G"',
            "[topics.metrics]",
            "retention_bytes",
        ),
        (
            'groups = ["aggregators", "archive"]',
            'groups = "aggregators"',
            "[topics.metrics]",
            "groups",
        ),
        (
            'groups = ["aggregators", "archive"]',
            'groups = ["bad group"]',
            "[topics.metrics]",
            "group name",
        ),
        (
            'groups = ["aggregators", "archive"]',
            "groups = 5",
            "[topics.metrics]",
            "TopicConfig.groups must be a list of group names, got 5",
        ),
        (  # (a table gave its keys: groups ("a",))
            'groups = ["aggregators", "archive"]',
            "groups = {a = 1}",
            "[topics.metrics]",
            "TopicConfig.groups must be a list of group names, got {'a': 1}",
        ),
    ],
)
def test_from_toml_bad_value(tmp_path: Path, old: str, new: str, table: str, key: str) -> None:
    assert old in GOOD_TOML
    path = write(tmp_path, GOOD_TOML.replace(old, new))
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert table in message
    assert key in message


@pytest.mark.parametrize("missing", ['name = "sensor-1"', 'data_dir = "var/sensor-1"'])
def test_from_toml_missing_required_key(tmp_path: Path, missing: str) -> None:
    path = write(tmp_path, GOOD_TOML.replace(missing, ""))
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message and "[node]" in message
    assert missing.split(" ")[0] in message


def test_from_toml_bad_topic_name(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML + '\n[topics."bad topic"]\npartitions = 2\n')
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message and "bad topic" in message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('node = "sensor-1"\n', "node"),
        ('topics = 5\n[node]\nname = "n"\ndata_dir = "d"\n', "topics"),
        ('[node]\nname = "n"\ndata_dir = "d"\n[topics]\nmetrics = 5\n', "topics.metrics"),
        ('[node]\nname = "n"\ndata_dir = "d"\nmdns = "false"\n', "mdns"),
        (
            '[node]\nname = "n"\ndata_dir = "d"\nheartbeat_interval_s = nan\n',
            "heartbeat_interval_s",
        ),
    ],
    ids=["node-not-a-table", "topics-not-a-table", "topic-not-a-table", "mdns-text", "nan"],
)
def test_from_toml_wrong_shapes_are_config_errors(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_toml(path)
    message = str(info.value)
    assert str(path) in message and named in message


def test_from_mapping_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"^my-source: \[node\]"):
        NodeConfig.from_mapping(
            {"node": {"name": "n", "data_dir": "d", "mdns": True, "bogus": 1}}, source="my-source"
        )


def test_a_bridge_table_given_to_a_node_says_how_to_start_a_bridge() -> None:
    data = {"node": {"name": "n", "data_dir": "d"}, "bridge": {"log_dir": "l"}}
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \['bridge'\].*Bridge.from_toml"):
        NodeConfig.from_mapping(data, source="b.toml")


@pytest.mark.parametrize("port", [1, 65535])  # (parsed only: the range's edges)
def test_a_seed_may_be_written_as_a_zeromq_endpoint(port: int) -> None:
    # (it was taken as the host "tcp://10.0.0.2", which no connect could reach)
    assert parse_seed(f"tcp://10.0.0.2:{port}") == ("10.0.0.2", port)
    assert seed_endpoints([f"tcp://10.0.0.2:{port}"]) == seed_endpoints([f"10.0.0.2:{port}"])


def test_only_a_metrics_address_may_be_ipv6() -> None:
    # Nodes listen on IPv4 only: an IPv6 seed was accepted and never reached anyone.
    assert parse_seed("[::1]:9464", what="metrics_address") == ("::1", 9464)
    assert node(metrics_address="[::1]:0").metrics_address == "[::1]:0"
    with pytest.raises(ConfigError, match="IPv6 address; zmesh binds IPv4 only"):
        parse_seed("[::1]:9464")
    with pytest.raises(ConfigError, match="neither a host name nor an IPv4"):
        node(metrics_address="local host:9464")


def test_a_relay_to_its_own_topic_is_refused() -> None:
    # It would consume what it publishes, republishing every message for good.
    assert RelayConfig(from_topic="a", to_topic="b", group="g").to_topic == "b"
    with pytest.raises(ConfigError, match="RelayConfig.to_topic must differ from from_topic"):
        RelayConfig(from_topic="a", to_topic="a", group="g")
    with pytest.raises(ConfigError, match=r"\[relays.loop\]: RelayConfig.to_topic"):
        NodeConfig.from_mapping(
            {
                "node": {"name": "n", "data_dir": "d"},
                "relays": {"loop": {"from_topic": "a", "to_topic": "a", "group": "g"}},
            }
        )


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("interval_s", math.inf, "ProducerConfig.interval_s must be a finite"),
        ("count", 1.5, "ProducerConfig.count must be an int >= 0"),
        ("count", True, "ProducerConfig.count must be an int >= 0"),
        # (it was taken, and each publish refused it, every interval, for good)
        ("key", 17, "ProducerConfig.key must be None or text"),
        ("key", "k" * 4097, "ProducerConfig.key must be None or text of at most 4096"),
        ("key", "\udcff", "ProducerConfig.key must be None or text"),
    ],
)
def test_producer_config_rejects(field: str, value: object, named: str) -> None:
    kw: dict[str, Any] = {"topic": "t", "source": "m:f", field: value}
    with pytest.raises(ConfigError, match=named):
        ProducerConfig(**kw)


# -- what a node is given -----------------------------------------------------------------
# (refused at the call: a TopicConfig of the wrong type was taken, then killed the IO thread)


def test_a_node_refuses_settings_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="Node config= must be a NodeConfig, got dict"):
        zmesh.Node(config={"name": "n", "data_dir": "d"})  # type: ignore[arg-type]
    cfg = NodeConfig(name="n", data_dir="d", mdns=False)
    for kw in (
        {"interfaces": ["127.0.0.1"]},
        {"mesh": "m"},
        {"mdns": False},
        {"seeds": ["10.0.0.2:5000"]},
    ):
        with pytest.raises(ConfigError, match=r"config=NodeConfig\(\.\.\.\) or keyword settings"):
            zmesh.Node(config=cfg, **kw)  # type: ignore[arg-type]  # (was ignored)
    with pytest.raises(ConfigError) as info:
        zmesh.Node("n", data_dir="d", partitons=4)
    assert "Node() has unknown setting(s) ['partitons']; known: [" in str(info.value)
    assert "'heartbeat_interval_s'" in str(info.value)
    # A string where a list belongs was split into characters; bytes or a number became a
    # directory named "b'/x'" or "5".
    for kw, named in [
        ({"interfaces": "127.0.0.1"}, "interfaces must be a list of addresses"),
        ({"seeds": "127.0.0.1:4000"}, "seeds must be a list of addresses"),
        ({"data_dir": b"/x"}, "data_dir must be a path"),
        ({"data_dir": 5}, "data_dir must be a path"),
        ({"trusted_keys": 5}, "trusted_keys must be a list of keys, got 5"),
        ({"secret_key_file": 5}, "secret_key_file must be a path"),
    ]:
        with pytest.raises(ConfigError, match=named):
            zmesh.Node("n", **{"data_dir": "d", **kw})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_node_takes_any_list_of_interfaces_and_a_path_for_its_data_dir(tmp_path: Path) -> None:
    with zmesh.Node(
        "n", data_dir=tmp_path / "n", interfaces=(i for i in ["127.0.0.1"]), mdns=False
    ) as node:
        assert node.config.interfaces == ("127.0.0.1",)
        assert node.config.data_dir == str(tmp_path / "n")
        assert node.control_address.startswith("127.0.0.1:")


def test_topic_refuses_a_config_of_another_type_and_unknown_options(make_node: Any) -> None:
    node = make_node("n")
    with pytest.raises(ConfigError, match="topic 'a': config must be a TopicConfig, got dict"):
        node.topic("a", {"partitions": 4})
    with pytest.raises(ConfigError, match="got int"):
        node.topic("a", 5)
    with pytest.raises(ConfigError) as info:
        node.topic("a", partitons=4)
    assert "topic 'a' has unknown option(s) ['partitons']; known: [" in str(info.value)
    assert "'partitions'" in str(info.value)
    for groups in (None, 5, "agg"):
        with pytest.raises(ConfigError, match="TopicConfig.groups must be a list of group names"):
            node.topic("a", groups=groups)
    # The IO thread lives on.
    assert node.topic("a", partitions=4).partitions == 4
    node.publish("a", b"x").wait_stored(5)


def test_subscribe_refuses_a_config_of_another_type_or_topic(make_node: Any) -> None:
    node = make_node("n")
    with pytest.raises(zmesh.ArgumentError, match="config= must be a SubscriptionConfig, got dict"):
        node.subscribe("a", config={"group": "g"})
    # The config's topic was ignored.
    with pytest.raises(zmesh.ArgumentError, match="subscribe to 'a' got a config for topic 'zzz'"):
        node.subscribe("a", config=SubscriptionConfig(group="g", topic="zzz"))
    sub = node.subscribe("a", config=SubscriptionConfig(group="g", topic="a"))
    assert sub.topic == "a"


def test_concurrency_is_for_a_handler(make_node: Any) -> None:
    # Without a handler it does nothing: the application's threads consume.
    node = make_node("n")
    with pytest.raises(zmesh.ArgumentError, match="concurrency=4 needs handler="):
        node.subscribe("a", "g", concurrency=4)
    with pytest.raises(zmesh.ArgumentError, match="concurrency=4 needs handler="):
        node.subscribe("a", config=SubscriptionConfig(group="g", concurrency=4))
    with pytest.raises(ConfigError, match="concurrency must be an int 1..1,024"):
        node.subscribe("a", "g", handler=print, concurrency=1025)
    sub = node.subscribe("a", "g", handler=lambda msg: None, concurrency=4)
    assert len(sub._workers) == 4
    sub.close()


def test_handler_threads_that_cannot_start_are_a_clear_error(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node("n")
    start = threading.Thread.start
    started: list[threading.Thread] = []

    def start_two(self: threading.Thread) -> None:
        if self.name.startswith("zmesh-handler") and len(started) == 2:
            raise RuntimeError("can't start new thread")
        if self.name.startswith("zmesh-handler"):
            started.append(self)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", start_two)
    with pytest.raises(
        zmesh.ZMeshError,
        match="started 2 of its concurrency=8 handler "
        "threads and no more .can't start new "
        "thread.; lower concurrency",
    ):
        node.subscribe("a", "g", handler=lambda msg: None, concurrency=8)
    monkeypatch.setattr(threading.Thread, "start", start)
    assert len(started) == 2 and not any(t.is_alive() for t in started)  # stopped, joined
    assert not [s for s in node._engine.queue.subscriptions() if not s.closed]
    sub = node.subscribe("a", "g", handler=lambda msg: None, concurrency=2)
    node.publish("a", b"x").wait_acked(5)
    sub.close()
