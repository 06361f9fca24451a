"""Configuration objects: what builds, what is refused and how the refusal reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from zmesh import ConfigError, NodeConfig, SubscriptionConfig, TopicConfig
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
        seeds=["[::1]:65535", "host.example:1"],
    )
    assert cfg.publish_timeout_s == 0


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
        ("groups", "agg", "TopicConfig.groups"),
        ("groups", ["ok", "not ok"], "group name"),
        ("groups", [""], "group name"),
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
        ("group", "-lead", "group name"),
        ("group", "g" * 129, "group name"),
        ("group", 5, "group name"),
        ("mode", "fanout", "mode"),
        ("max_in_flight", 0, "SubscriptionConfig.max_in_flight"),
        ("max_in_flight", True, "SubscriptionConfig.max_in_flight"),
        ("max_in_flight", 2.0, "SubscriptionConfig.max_in_flight"),
        ("batch_size", 0, "SubscriptionConfig.batch_size"),
        ("batch_size", "10", "SubscriptionConfig.batch_size"),
        # past what a producer decodes in a hello (it would never know the member)
        ("batch_size", 10_001, "SubscriptionConfig.batch_size"),
        ("max_in_flight", (1 << 24) + 1, "SubscriptionConfig.max_in_flight"),
        ("concurrency", -1, "SubscriptionConfig.concurrency"),
    ],
)
def test_subscription_config_rejects(field: str, value: object, named: str) -> None:
    kw: dict[str, Any] = {"group": "agg", field: value}
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
        ("interfaces", "127.0.0.1", "NodeConfig.interfaces"),
        ("seeds", "10.0.0.2:5000", "NodeConfig.seeds"),
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
        ("dedupe_window_s", 0, "NodeConfig.dedupe_window_s"),
        ("topics", {"bad name": TopicConfig()}, "topic name"),
        ("topics", {"metrics": {"partitions": 4}}, "NodeConfig.topics['metrics']"),
    ],
)
def test_node_config_rejects(field: str, value: object, named: str) -> None:
    kw: dict[str, Any] = {"heartbeat_interval_s": 1.0, field: value}
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
        ("max_map_size_bytes = 8388608", "max_map_size_bytes = 1024", "[node]",
         "max_map_size_bytes"),
        ('durability = "fsync"', 'durability = "disk"', "[topics.metrics]", "durability"),
        ("partitions = 8", "partitions = 0", "[topics.metrics]", "partitions"),
        ("partitions = 8", 'partitions = "8"', "[topics.metrics]", "partitions"),
        ("ttl_s = 3600", "ttl_s = -1", "[topics.metrics]", "ttl_s"),
        ("retention_s = 86400", "retention_s = -1", "[topics.metrics]", "retention_s"),
        ("retention_bytes = 1073741824", 'retention_bytes = "1G"', "[topics.metrics]",
         "retention_bytes"),
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


@pytest.mark.parametrize("port", [1, 65535])  # (parsed only: the range's edges)
def test_a_seed_may_be_written_as_a_zeromq_endpoint(port: int) -> None:
    # (it was taken as the host "tcp://10.0.0.2", which no connect could reach)
    assert parse_seed(f"tcp://10.0.0.2:{port}") == ("10.0.0.2", port)
    assert parse_seed(f"tcp://[::1]:{port}") == ("::1", port)
    assert seed_endpoints([f"tcp://10.0.0.2:{port}"]) == seed_endpoints([f"10.0.0.2:{port}"])
