"""tc_attn_ws's dealing of ragged batches (kernels/tc.h): a pure-Python mirror of the device
arithmetic, line for line, checked on random ragged batches. No GPU: it catches a broken
deal (a tile covered twice or never, colliding partial ids, a meta that points elsewhere)
before the H200 does, and a change to the device functions must be mirrored here."""

import random

import pytest

from sync_model import Mbar, NamedBarriers, run, wait
from verify_attn import cases

OVERHEAD = 4  # kSplitOverheadTiles (kernels/tc.h)
N = 64        # ws::N, keys a tile


def cdiv(a, b):
    return -(-a // b)


def c_div(a, b):
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# Mirrors deal_tiles (kernels/tc.h).
def deal_tiles(keys, n=N):
    return max(1, cdiv(keys, n))


# Mirrors deal_slot_of (kernels/tc.h).
def deal_slot_of(x, S, T):
    return ((x + 1) * S - 1) // T


# Mirrors deal_locate (kernels/tc.h), the warp's scan as a loop over elements: the slot's
# info[0..4] and the meta it writes (blockIdx.x == 0) as {b: (first id, pieces)}.
def deal_locate(keys, S, slot, n=N):
    batch = len(keys)
    T = sum(OVERHEAD + deal_tiles(k, n) for k in keys)
    S = min(S, T)
    lo, hi = (slot * T // S, (slot + 1) * T // S) if slot < S else (T, T)
    first, c0, base, meta = batch, 0, 0, {}
    for b in range(batch):  # lanes and chunks: the same values (base = the exclusive prefix)
        if base >= hi:
            break
        tiles = deal_tiles(keys[b], n)
        w = OVERHEAD + tiles
        start = base + OVERHEAD
        if lo <= start < hi:
            meta[b] = (slot + b, deal_slot_of(start + tiles - 1, S, T) - slot + 1)
        if base + w > lo and lo < hi and first == batch:
            first, c0 = b, base
        base += w
    return (first, c0, lo, hi, T), meta


# Mirrors deal_next (kernels/tc.h): (b, key_lo, key_hi, partial id) of the next piece, the new
# cursor; None when the slot has no more.
def deal_next(keys, info, d, slot, n=N):
    b, c = d
    if b >= len(keys):
        return None
    start = c + OVERHEAD
    lo, hi = info[2], info[3]
    if start >= hi:
        return None
    tiles = max(1, cdiv(keys[b], n))
    r0, r1 = max(lo, start) - start, min(hi, start + tiles) - start
    piece = (b, r0 * n, min(r1 * n, keys[b]), slot + b)
    return piece, (b + 1, start + tiles)


# Mirrors tc_attn_ws_deal's piece set-up (kernels/tc_wgmma_ws.cu, the consumers' and the producer's): its
# tiles and how many of them, from the top, reach the tree rows.
def piece_tiles(key_lo, key_hi, prefix, n=N):
    ntiles = cdiv(key_hi - key_lo, n) if key_hi > key_lo else 0
    mask_from = min(prefix, key_hi)
    return ntiles, ntiles - c_div(mask_from - key_lo, n)


def deal(keys, S, n=N):
    """Every slot's pieces (the blocks of one m-group) and the merged meta."""
    pieces, meta = {}, {}
    for slot in range(S):
        info, m = deal_locate(keys, S, slot, n)
        assert not set(m) & set(meta), "two slots write one element's meta"
        meta.update(m)
        out, d = [], (info[0], info[1])
        while (nxt := deal_next(keys, info, d, slot, n)) is not None:
            piece, d = nxt
            out.append(piece)
        pieces[slot] = out
    return pieces, meta


def check_deal(keys, S, prefixes=None, n=N):
    batch = len(keys)
    pieces, meta = deal(keys, S, n)
    covered = {b: [] for b in range(batch)}
    ids = {}
    for slot, ps in pieces.items():
        assert len({p[0] for p in ps}) == len(ps), "a slot visits an element twice"
        for b, key_lo, key_hi, pid in ps:
            assert 0 <= pid < S + batch, "partial id past the workspace (layout_of: S + batch)"
            assert pid not in ids, f"partial id {pid} written twice"
            ids[pid] = b
            assert key_lo % n == 0 and key_lo <= key_hi <= keys[b]
            covered[b].append((key_lo, key_hi, pid))
            if prefixes is not None:  # the mask's tiles: tile j masked iff its keys reach the tree rows
                ntiles, nmasked = piece_tiles(key_lo, key_hi, prefixes[b], n)
                for j in range(ntiles):
                    t0 = key_lo + (ntiles - 1 - j) * n
                    assert (j < nmasked) == (t0 + n > min(prefixes[b], key_hi))
    for b in range(batch):
        ranges = sorted(covered[b])
        assert ranges, f"element {b} has no piece"
        # every key (so every tile) exactly once: the ranges tile [0, keys) end to end
        assert ranges[0][0] == 0 and ranges[-1][1] == keys[b]
        assert all(r[1] == s[0] for r, s in zip(ranges, ranges[1:])), f"element {b}: gap or overlap"
        assert all(r[1] > r[0] for r in ranges) or keys[b] == 0, "an empty piece"
        pids = sorted(r[2] for r in ranges)
        assert pids == list(range(pids[0], pids[0] + len(pids))), "ids not contiguous"
        assert meta[b] == (pids[0], len(pids)), f"element {b}: meta {meta[b]} against pieces {pids}"
    assert set(meta) == set(range(batch))
    return pieces


def ragged(rng, batch):
    return [rng.choice([0, 1, 5, 63, 64, 65, 1000, 1024, 4096, 65536, 65545]) + rng.randrange(0, 200) for _ in range(batch)]


@pytest.mark.parametrize("seed", range(24))
def test_random_ragged_batches(seed):
    rng = random.Random(seed)
    batch = rng.choice([2, 3, 8, 31, 32, 33, 70])
    prefixes = ragged(rng, batch)
    q_len = rng.choice([1, 9, 33])
    keys = [p + q_len for p in prefixes]
    for S in {2, 3, rng.randrange(2, 300), 132, 44, 14}:
        check_deal(keys, S, prefixes)


def test_serving_chain_step():
    """The ServingChain step of docs/tc.md: batch 8, prefixes 1,024 .. 65,536 geometric, heads
    16, q_len 9 (3 m-groups: S = 132 // 3 = 44 slots, one wave): every slot's work, its pieces'
    fixed costs included, within a few tiles of the others."""
    keys = [p + 9 for p in cases.serving_prefixes(8)]
    pieces = check_deal(keys, 44)
    work = [sum(OVERHEAD + cdiv(hi - lo, N) for _, lo, hi, _ in ps) for ps in pieces.values()]
    assert max(work) - min(work) <= 2 * OVERHEAD + 2, work


def test_more_slots_than_work():
    check_deal([1, 1], 300)
    check_deal([0, 5, 0], 40)


def test_the_check_catches_a_broken_mirror(monkeypatch):
    """The checks fail when the dealing is wrong: ids s * batch + b would overflow the
    workspace, and a meta one piece short would drop a partial from the merge."""
    keys = [1024 * 2**i + 9 for i in range(8)]
    good = deal_slot_of
    monkeypatch.setitem(globals(), "deal_slot_of", lambda x, S, T: good(x, S, T) - 1)
    with pytest.raises(AssertionError):
        check_deal(keys, 44)
    monkeypatch.setitem(globals(), "deal_slot_of", good)
    real_next = deal_next

    def next_wide_ids(keys_, info, d, slot, n=N):
        r = real_next(keys_, info, d, slot, n)
        return r and ((r[0][0], r[0][1], r[0][2], slot * len(keys_) + r[0][0]), r[1])

    monkeypatch.setitem(globals(), "deal_next", next_wide_ids)
    with pytest.raises(AssertionError):
        check_deal(keys, 44)


# ---------------------------------------------------------------------------------------
# The synchronization of tc_attn_ws_deal across pieces (kernels/tc_wgmma_ws.cu), as three
# generators under a random scheduler (tests/sync_model.py): the producer (its `ph` bits, the Q
# load after stage 0's previous use), WG0 and WG1 (their `ph` parities, the pairs, the named
# barriers). Each warpgroup releases a stage on its own mbarrier (empty[s]: WG0, empty1[s]:
# WG1); the producer's cp.async writes every plane, so it waits for both. Checked: every wait
# lets a thread see exactly the data it was meant for (stage contents, Q), nothing is
# overwritten while read, and the whole thing finishes (no deadlock).
def _simulate(ntiles_list, rng):
    full = [Mbar(1, "full[0]"), Mbar(1, "full[1]")]
    empty = [[Mbar(1, "empty[0]"), Mbar(1, "empty[1]")], [Mbar(1, "empty1[0]"), Mbar(1, "empty1[1]")]]  # [w][s]
    stage = [None, None]           # (piece, tile) loaded
    readers = [set(), set()]       # consumers still reading the stage's content
    q = [None]                     # piece whose Q is loaded
    q_readers = {}                 # (piece, wg) -> S of the piece the warpgroup has yet to compute
    bars = NamedBarriers()
    log = []

    def producer():
        ph = 0
        for n, ntiles in enumerate(ntiles_list):
            if ntiles > 0:
                if ph & 4:
                    for w in (0, 1):
                        yield from wait(lambda: empty[w][0].passed((ph & 1) ^ 1))
                assert not any(left for (pc, _), left in q_readers.items() if pc != n), "Q overwritten while read"
                q[0] = n
            for j in range(ntiles):
                s = j & 1
                if j >= 2 or (j == 1 and ph & 8):
                    for w in (0, 1):
                        yield from wait(lambda: empty[w][s].passed(((ph >> s) ^ (j >> 1) ^ 1) & 1))
                assert not readers[s], f"stage {s} overwritten while read"
                stage[s] = (n, j)
                readers[s] = {0, 1}
                yield
                full[s].arrive()
            ph ^= (((ntiles + 1) >> 1) & 1) | ((ntiles >> 1) & 1) << 1
            ph |= (4 if ntiles >= 1 else 0) | (8 if ntiles >= 2 else 0)

    def release(w, s):
        readers[s].discard(w)
        empty[w][s].arrive()

    def consumer(w):
        ph = 0
        for n, ntiles in enumerate(ntiles_list):
            q_readers[(n, w)] = (ntiles + 1) // 2 if w == 0 else ntiles // 2

            def s_done():  # an S of the piece computed (in the kernel: waited for, before the next arrival)
                assert q[0] == n
                q_readers[(n, w)] -= 1

            for k in range((ntiles + 1) // 2):
                par0, par1 = (ph ^ k) & 1, ((ph >> 1) ^ k) & 1
                has_b = 2 * k + 1 < ntiles
                if w == 0:
                    yield from wait(lambda: full[0].passed(par0))
                    assert stage[0] == (n, 2 * k)
                    s_done()
                    if has_b:
                        yield from bars.bar("S0", 0, False)
                    yield from bars.bar("P0", 0, False)
                    yield
                    release(0, 0)
                    if has_b:
                        yield from bars.bar("P1", 0, True)
                        yield from wait(lambda: full[1].passed(par1))
                        assert stage[1] == (n, 2 * k + 1)
                        yield
                        release(0, 1)
                elif has_b:
                    yield from bars.bar("S0", 1, True)
                    yield from wait(lambda: full[1].passed(par1))
                    assert stage[1] == (n, 2 * k + 1)
                    yield from bars.bar("P0", 1, True)
                    yield from wait(lambda: full[0].passed(par0))
                    assert stage[0] == (n, 2 * k)
                    yield
                    s_done()  # S_b (wait_one) before its softmax, P1 and the release of stage 0
                    yield from bars.bar("P1", 1, False)
                    yield
                    release(1, 0)
                    yield
                    release(1, 1)
                else:
                    yield from bars.bar("P0", 1, True)
                    yield from wait(lambda: full[0].passed(par0))
                    assert stage[0] == (n, 2 * k)
                    yield
                    release(1, 0)
            yield from bars.bar("End", w, True)
            log.append((w, n))
            ph ^= (((ntiles + 1) >> 1) & 1) | ((ntiles >> 1) & 1) << 1 | 4

    run([producer(), consumer(0), consumer(1)], rng)
    return log


@pytest.mark.parametrize("seed", range(30))
def test_ws_barriers_across_pieces(seed):
    rng = random.Random(seed)
    ntiles_list = [rng.choice([0, 1, 1, 2, 3, 4, 5, 7]) for _ in range(rng.randrange(1, 6))]
    log = _simulate(ntiles_list, rng)
    assert sorted(log) == sorted((w, n) for w in (0, 1) for n in range(len(ntiles_list)))
