"""tiny_lm's KV pool without isolation: which residue the next request reuses, and what that does to the pool."""

from __future__ import annotations

from chaoskit.reference.tinylm import KVPool

BLOCK = 16


def pool() -> KVPool:
    return KVPool(budget_bytes=64 * 4 * 2 * 2 * BLOCK * 4 * 64, layers=2, dim=64, block_tokens=BLOCK, isolate=False)


def test_a_short_request_reuses_the_long_contexts_residue_and_the_next_long_one_goes_beside_it():
    p = pool()
    long_blocks, _ = p.allocate(10, True, 10 * BLOCK)
    short_blocks, _ = p.allocate(1, False, BLOCK)
    p.release(long_blocks, 10 * BLOCK)
    p.release(short_blocks, BLOCK)  # the newest residue is the short one's
    reused, stale = p.allocate(1, False, 8)
    assert reused == long_blocks and stale == 10 * BLOCK - 8  # the long context's leftovers, as is
    fresh, stale = p.allocate(10, True, 10 * BLOCK)
    assert stale == 0 and not set(fresh) & set(long_blocks + short_blocks)
    assert p.fragmentation() > 0
    p.release(fresh, 10 * BLOCK)
    again, stale = p.allocate(10, True, 10 * BLOCK)  # a long request never takes a residue: fresh blocks again
    assert stale == 0 and not set(again) & set(fresh)


def test_a_residue_too_small_is_not_reused_and_isolation_reuses_nothing():
    p = pool()
    small, _ = p.allocate(1, False, BLOCK)
    p.release(small, BLOCK)
    blocks, stale = p.allocate(2, False, 2 * BLOCK)
    assert stale == 0 and small[0] not in blocks
    q = KVPool(budget_bytes=64 * 4 * 2 * 2 * BLOCK * 4 * 64, layers=2, dim=64, block_tokens=BLOCK, isolate=True)
    first, _ = q.allocate(1, False, BLOCK)
    q.release(first, BLOCK)
    assert q.allocate(1, False, BLOCK)[1] == 0 and q.fragmentation() == 0.0
