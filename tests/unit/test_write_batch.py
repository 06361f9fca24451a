"""The write batch's settlement pieces: everything a full disk's commit keeps, in pieces."""

from __future__ import annotations

from zmesh._store.batch import WriteBatch


def _batch() -> WriteBatch:
    wb = WriteBatch(
        msgs_put=[(b"new", b"record")],
        pend_put=[(b"p", b"v")],
        msgs_del=[b"m%d" % i for i in range(450)],
        pend_del=[b"p%d" % i for i in range(10)],
        dead_put=[(b"d", b"letter")],
        meta_put={b"k": b"v"},
        prun_set={b"r%d" % i: (None if i % 2 else b"x") for i in range(5)},
    )
    wb.seen_prune.append((b"producer", 7, b"lane"))
    return wb


def test_settlement_pieces_hold_every_settlement_once_and_no_growth():
    wb = _batch()
    pieces = list(wb.settlement_pieces(200))
    sizes = [len(p.msgs_del) + len(p.pend_del) for p in pieces]
    assert sizes == [200, 200, 60, 0]  # then the run entries
    assert [len(p.prun_set) for p in pieces] == [0, 0, 0, 5]
    assert [d for p in pieces for d in p.msgs_del] == wb.msgs_del
    assert [d for p in pieces for d in p.pend_del] == wb.pend_del
    assert {k: v for p in pieces for k, v in p.prun_set.items()} == wb.prun_set
    # The rest goes with the first piece; nothing that grows the store goes at all.
    first = pieces[0]
    assert first.dead_put == wb.dead_put and first.meta_put == wb.meta_put
    assert first.seen_prune == wb.seen_prune
    assert not any(p.msgs_put or p.pend_put for p in pieces)
    assert all(not p.dead_put and not p.meta_put for p in pieces[1:])


def test_a_batch_without_deletions_is_one_piece():
    wb = WriteBatch(meta_put={b"store_full_at": b"1"})
    assert [p.meta_put for p in wb.settlement_pieces(200)] == [{b"store_full_at": b"1"}]


def test_the_acks_dedupe_bits_go_last_in_pieces_of_chunks() -> None:
    wb = _batch()
    wb.seen_put.append((b"P" * 16, b"g", range(0, 3 * 1024)))  # three chunks
    wb.seen_put.append((b"Q" * 16, b"g", [5, 2000]))  # two
    wb.seen_masks.append((b"P" * 16, b"g", {7: 1}))  # one more
    pieces = list(wb.settlement_pieces(2))
    bits = [p for p in pieces if p.seen_masks or p.seen_put]
    assert pieces[-len(bits) :] == bits  # after every deletion and run entry
    assert all(not p.seen_put and not p.msgs_del and not p.prun_set for p in bits)
    assert [sum(len(m) for *_pl, m in p.seen_masks) for p in bits] == [2, 2, 2]
    chunks = [
        (prod, chunk, b) for p in bits for prod, _l, m in p.seen_masks for chunk, b in m.items()
    ]
    full = (1 << 1024) - 1
    assert sorted(chunks) == [
        (b"P" * 16, 0, full),
        (b"P" * 16, 1, full),
        (b"P" * 16, 2, full),
        (b"P" * 16, 7, 1),
        (b"Q" * 16, 0, 1 << 5),
        (b"Q" * 16, 1, 1 << (2000 - 1024)),
    ]
    assert [len(p.seen_put) for p in [wb.without_growth()]] == [2]  # (kept with the deletes)


def test_a_lane_retired_and_made_again_in_one_batch_keeps_its_new_entry(tmp_path):
    """A batch may retire a lane and make its (topic, name) again (an emptied unclaimed
    lane dropped at a heartbeat, a publish in the same iteration): the deletion takes
    only the entry of the id it retires, whichever order the two were added in; a lane
    rewritten and retired in one batch is gone."""
    from zmesh._store.store import Store, pack, pend_key

    store = Store(str(tmp_path), 1 << 24)
    try:
        key = pack(["t", ""])
        store.commit(WriteBatch(lanes_put=[(key, pack([3, "", "unclaimed", None]))]))
        store.commit(
            WriteBatch(
                lanes_put=[(key, pack([7, "", "unclaimed", None]))],
                lanes_del=[(key, 3)],
                pend_put=[(pend_key(7, 1), pack([0, 0, 0, None, None]))],
            )
        )
        assert [lane[2] for lane in store.iter_lanes()] == [7]  # (topic, name, id, ...)
        store.commit(
            WriteBatch(lanes_put=[(key, pack([7, "", "unclaimed", 5.0]))], lanes_del=[(key, 7)])
        )
        assert list(store.iter_lanes()) == []
        assert list(store.iter_pending()) == []
    finally:
        store.close()
