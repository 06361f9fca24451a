"""What ``memory`` messages count against the memory budget, one by one and summed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zmesh._engine.outbox.record import Record
from zmesh._engine.outbox.records import MEM_RECORD_OVERHEAD, mem_size, mem_total

fields_st = st.builds(
    lambda key, headers, payload: Record("t", 0, key, headers, 0, 1.0, None, None, payload, 0),
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
    st.binary(max_size=300),
)


@given(st.lists(fields_st, max_size=20))
def test_the_sum_counts_what_each_counts(many: list[Record]) -> None:
    assert mem_total(many) == sum(map(mem_size, many))


def test_a_message_counts_its_payload_key_and_headers() -> None:
    bare = Record("t", 0, None, None, 0, 1.0, None, None, b"x" * 100, 0)
    assert mem_size(bare) == 100 + MEM_RECORD_OVERHEAD
    keyed = Record("t", 0, "abc", {"a": "b"}, 0, 1.0, None, None, b"", 0)
    assert mem_size(keyed) == MEM_RECORD_OVERHEAD + 3 + 5  # headers packed: 0x81 a1 61 a1 62
