"""Subjects: the name rules, and the token trie against a reference implementation."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmesh import ConfigError, SubscriptionConfig, TopicConfig
from zmesh._subjects import (
    CACHED_TOPICS,
    MAX_SUBJECT_CHARS,
    SubjectMap,
    SubjectTrie,
    TopicConfigs,
    check_subject,
    is_pattern,
    matcher,
)
from zmesh.config import NodeConfig, check_name

PROPS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def reference(pattern: str, topic: str) -> bool:
    """NATS's rules as a regular expression: ``*`` one token, ``>`` one or more."""
    parts = []
    for token in pattern.split("."):
        parts.append("[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token))
    return re.fullmatch(r"\.".join(parts), topic) is not None


def reference_best(patterns: list[str], topic: str) -> str | None:
    """The most specific of ``patterns`` matching ``topic``, by the documented rule:
    token by token from the left, a literal beats ``*``, which beats ``>``."""

    def beats(a: str, b: str) -> bool:
        rank = {"*": 1, ">": 0}
        for x, y in zip(a.split("."), b.split("."), strict=False):
            rx, ry = rank.get(x, 2), rank.get(y, 2)
            if rx != ry:
                return rx > ry
        return len(a.split(".")) > len(b.split("."))

    best = None
    for p in patterns:
        if reference(p, topic) and (best is None or beats(p, best)):
            best = p
    return best


# A small alphabet, so that random patterns and topics meet often.
tokens = st.sampled_from(["a", "b", "c", "line4", "x-1", "t_2"])
topics = st.lists(tokens, min_size=1, max_size=5).map(".".join)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(tokens, st.just("*")), min_size=1, max_size=5))
    if draw(st.booleans()):
        parts.append(">")
    return ".".join(parts)


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["metrics", "plant.line4.temp", "a.b-c.d_e", "0.x", "t" * MAX_SUBJECT_CHARS, "a._b.-c"],
)
def test_valid_topic_names(name: str) -> None:
    assert check_name("topic", name) == name
    assert check_subject("topic", name, wildcards=True) == name
    assert not is_pattern(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "non-empty"),
        ("a..b", "empty token"),
        ("a.", "empty token"),
        (".a", "start with a letter or a digit"),
        ("-a", "start with a letter or a digit"),
        ("a b", "character other than"),
        ("a/b", "character other than"),
        ("a.b*", "character other than"),
        ("a.>b", "character other than"),
        ("a.b\n", "character other than"),  # (a trailing newline: not the same name)
        ("t" * (MAX_SUBJECT_CHARS + 1), "more than 128"),
        (5, "non-empty string"),
    ],
)
def test_invalid_topic_names_say_why(name: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        check_subject("topic", name, wildcards=True)


@pytest.mark.parametrize("pattern", ["a.*", "*.b", "a.>", ">", "*", "*.*.>", "plant.*.temp"])
def test_patterns_are_valid_where_wildcards_are(pattern: str) -> None:
    assert is_pattern(pattern)
    assert check_subject("topic", pattern, wildcards=True) == pattern
    with pytest.raises(ConfigError, match="wildcard: a topic that is published names one"):
        check_name("topic", pattern)


@pytest.mark.parametrize("pattern", ["a.>.b", ">.a", ">.>"])
def test_rest_only_at_the_end(pattern: str) -> None:
    with pytest.raises(ConfigError, match="'>' may only be its last token"):
        check_subject("topic", pattern, wildcards=True)


def test_configs_take_patterns_where_a_subscription_or_a_setting_goes() -> None:
    assert SubscriptionConfig(group="g", topic="plant.>").topic == "plant.>"
    cfg = NodeConfig(name="n", data_dir="d", topics={"plant.*.temp": TopicConfig(keep_last=1)})
    assert cfg.topics["plant.*.temp"].keep_last == 1
    with pytest.raises(ConfigError, match="'>' may only"):
        NodeConfig(name="n", data_dir="d", topics={"a.>.b": TopicConfig()})


def test_new_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="keep_last must be an int >= 0"):
        TopicConfig(keep_last=-1)
    with pytest.raises(ConfigError, match="keep_last"):
        TopicConfig(keep_last=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="deliver must be None or 'last_per_key'"):
        SubscriptionConfig(group="g", deliver="all")  # type: ignore[arg-type]
    assert SubscriptionConfig(deliver="last_per_key").mode == "ephemeral"


# -- matching -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("plant.*.temp", "plant.line4.temp", True),
        ("plant.*.temp", "plant.temp", False),
        ("plant.*.temp", "plant.line4.a.temp", False),
        ("plant.>", "plant.line4", True),
        ("plant.>", "plant.line4.temp", True),
        ("plant.>", "plant", False),
        (">", "a", True),
        ("*", "a.b", False),
        ("a.b", "a.b", True),
        ("a.b", "a.bc", False),
    ],
)
def test_nats_rules(pattern: str, topic: str, expected: bool) -> None:
    assert matcher(pattern)(topic) is expected
    assert reference(pattern, topic) is expected


@PROPS
@given(st.lists(patterns(), max_size=30), st.lists(topics, min_size=1, max_size=20))
def test_trie_matches_what_the_reference_matches(pats: list[str], tops: list[str]) -> None:
    trie: SubjectTrie[int] = SubjectTrie()
    for i, p in enumerate(pats):
        trie.add(p, i)
    for topic in tops:
        want = sorted(i for i, p in enumerate(pats) if reference(p, topic))
        assert sorted(trie.match(topic)) == want


@PROPS
@given(st.lists(patterns(), min_size=1, max_size=30), st.data())
def test_trie_after_removals_matches_what_is_left(pats: list[str], data: st.DataObject) -> None:
    trie: SubjectTrie[int] = SubjectTrie()
    for i, p in enumerate(pats):
        trie.add(p, i)
    gone = data.draw(st.sets(st.integers(0, len(pats) - 1)))
    for i in gone:
        assert trie.remove(pats[i], i)
        assert not trie.remove(pats[i], i)  # (once only)
    assert len(trie) == len(pats) - len(gone)
    for topic in data.draw(st.lists(topics, min_size=1, max_size=10)):
        want = sorted(i for i, p in enumerate(pats) if i not in gone and reference(p, topic))
        assert sorted(trie.match(topic)) == want
    for i in set(range(len(pats))) - gone:
        trie.remove(pats[i], i)
    assert len(trie) == 0 and not trie._root.children  # (empty branches pruned)


@PROPS
@given(st.lists(st.one_of(patterns(), topics), max_size=20), st.lists(topics, max_size=10))
def test_map_holds_names_and_patterns_and_forgets_its_cache(
    subjects: list[str], tops: list[str]
) -> None:
    m: SubjectMap[int] = SubjectMap((s, i) for i, s in enumerate(subjects))
    assert bool(m) is bool(subjects)
    for topic in tops:
        want = sorted(i for i, s in enumerate(subjects) if reference(s, topic))
        assert sorted(m.match(topic)) == want
    m.add(">", -1)  # (a pattern added later is seen by a topic cached before too)
    for topic in tops:
        assert -1 in m.match(topic)
        m.add(topic, -2)
        assert -2 in m.match(topic)


@PROPS
@given(st.lists(patterns(), unique=True, max_size=15), topics)
def test_the_most_specific_pattern_wins(pats: list[str], topic: str) -> None:
    configs = TopicConfigs({p: TopicConfig(partitions=i + 1) for i, p in enumerate(pats)})
    best = reference_best(pats, topic)
    got = configs.of(topic)
    if best is None:
        assert got is None
    else:
        assert got is configs[best]
    own = TopicConfig(partitions=99)
    configs[topic] = own  # a topic's own settings beat every pattern's
    assert configs.of(topic) is own


def test_a_pattern_set_later_applies_to_topics_asked_about_before() -> None:
    configs = TopicConfigs()
    assert configs.of("plant.line4.temp") is None
    wide, narrow = TopicConfig(keep_last=1), TopicConfig(keep_last=2)
    configs["plant.>"] = wide
    assert configs.of("plant.line4.temp") is wide
    configs["plant.*.temp"] = narrow
    assert configs.of("plant.line4.temp") is narrow
    assert configs.of("plant.line4.pressure") is wide
    assert sorted(configs) == ["plant.*.temp", "plant.>"]


def test_caches_per_topic_are_bounded_and_answer_the_same() -> None:
    """Topics come and go (one per device): what is cached per topic stays within
    CACHED_TOPICS, and a topic asked about again after its entry went is answered the
    same."""
    m: SubjectMap[int] = SubjectMap([("dev.*", 1), ("dev.7", 2)])
    own, wide = TopicConfig(partitions=3), TopicConfig(partitions=5)
    configs = TopicConfigs({"dev.>": wide, "dev.7": own})
    for i in range(3 * CACHED_TOPICS):
        topic = f"dev.{i}"
        assert m.match(topic) == ((2, 1) if i == 7 else (1,))
        assert configs.of(topic) is (own if i == 7 else wide)
    assert len(m._cache) <= CACHED_TOPICS and len(configs._resolved) <= CACHED_TOPICS
    assert m.match("dev.7") == (2, 1) and configs.of("dev.7") is own
