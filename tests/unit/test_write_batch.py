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
