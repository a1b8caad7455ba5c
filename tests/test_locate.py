"""tc's split mode (kernels/tc.h, locate): a pure-Python mirror of the device arithmetic that
hands each block its element and key range, with the top split's extra weight (TopExtra,
kTopExtraTiles of kernels/tc_wgmma_ws.h on wgmma_ws and wgmma_tma; 0 elsewhere). No GPU: it
catches a split left empty, a tile covered twice or never, or a top split that does not get
lighter, before the GPU does; a change to locate must be mirrored here."""

import random
import re
from pathlib import Path

import pytest

from test_dealing import N, OVERHEAD, cdiv  # tiles of 64 keys, kSplitOverheadTiles

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


# Mirrors locate<TopExtra> (kernels/tc.h), the warp's scan as a loop over elements: the slot's
# (element, key begin, key end, the element's first slot, its splits, this split), or None.
def locate(keys, slots, slot, top_extra, n=N):
    batch = len(keys)
    work = [cdiv(k, n) + OVERHEAD for k in keys]
    total, extra = sum(work), slots - batch
    base = 0
    for b in range(batch):
        splits = 1 + extra * work[b] // total
        if base <= slot < base + splits:
            k = slot - base
            tiles = cdiv(keys[b], n)
            lo, hi = k * tiles // splits, (k + 1) * tiles // splits
            if top_extra > 0:
                span = tiles + (min(top_extra, (tiles - 1) // (splits - 1)) if splits > 1 else 0)
                lo = k * span // splits
                hi = tiles if k + 1 == splits else (k + 1) * span // splits
            return b, lo * n, min(hi * n, keys[b]), base, splits, k
        base += splits
    return None


def ranges(keys, slots, top_extra):
    """{element: [(key begin, key end), ...] in split order} over every slot."""
    out = {}
    for slot in range(slots):
        got = locate(keys, slots, slot, top_extra)
        if got:
            b, lo, hi, first, splits, k = got
            assert first + k == slot
            out.setdefault(b, []).append((lo, hi))
    return out


def check(keys, slots, top_extra):
    for b, rs in ranges(keys, slots, top_extra).items():
        assert rs[0][0] == 0 and rs[-1][1] == keys[b], (b, rs)
        assert all(a[1] == c[0] for a, c in zip(rs, rs[1:])), ("a gap or an overlap", b, rs)
        tiles = cdiv(keys[b], N)
        if len(rs) <= tiles:  # as many splits as tiles or fewer: none is empty
            assert all(hi > lo for lo, hi in rs), ("an empty split", b, rs)


def test_the_kernels_weigh_the_top_split_on_the_two_paths_only():
    """locate's weight is a template argument: tc_attn_ws and tc_attn_tma pass kTopExtraTiles, every
    other kernel the default 0 (its machine code as before the weight)."""
    value = re.search(r"constexpr int kTopExtraTiles = (\d+);", (KERNELS / "tc_wgmma_ws.h").read_text())
    assert value and int(value[1]) > 0
    assert "block_work<kTopExtraTiles>(" in (KERNELS / "tc_wgmma_ws.cu").read_text()
    assert "block_work<ws::kTopExtraTiles>(" in (KERNELS / "tc_wgmma_tma.cu").read_text()
    for other in ("tc_mma.cu", "tc_wgmma.h"):
        assert "block_work(" in (KERNELS / other).read_text()


@pytest.mark.parametrize("top_extra", [0, 1, 2, 4, 8])
def test_batch_one_splits_tile_the_keys(top_extra):
    """Batch 1 as the plan splits it (every split at least min_split_tiles' floor of tiles, or the
    prefix shorter than the tensor): contiguous, complete, none empty."""
    rng = random.Random(top_extra)
    for _ in range(400):
        keys = rng.randint(1, 70_000)
        splits = rng.randint(1, min(128, max(1, cdiv(keys, N))))
        check([keys], splits, top_extra)


def test_the_top_split_takes_fewer_tiles():
    """h8 q9 p65536 on 132 SMs: 2 m-groups, 66 splits of 1,025 tiles. Unweighted the top split
    (the masked tile's) holds 16 tiles like the heaviest; weighted by 4 it holds 12, and no other
    split gains more than one."""
    keys = 65_536 + 9
    plain = [cdiv(hi, N) - lo // N for lo, hi in ranges([keys], 66, 0)[0]]
    top4 = [cdiv(hi, N) - lo // N for lo, hi in ranges([keys], 66, 4)[0]]
    assert plain[-1] == max(plain) == 16
    assert top4[-1] == 12 and max(top4) == 16 and sum(top4) == sum(plain) == cdiv(keys, N)


def test_the_weight_is_capped_where_splits_are_short():
    """h64 q9 p2048: 11 splits of 33 tiles (3 a split, the plan's floor on these paths). A weight of
    4 would empty the top split; capped at 3 it keeps one tile, the masked one."""
    rs = ranges([2048 + 9], 11, 4)[0]
    assert rs[-1] == (32 * N, 2048 + 9)
    assert all(hi > lo for lo, hi in rs)


def test_ragged_batches_keep_their_slots():
    """Several elements (the mma path's split plans; wgmma_ws and wgmma_tma deal those instead):
    every element's splits tile it, with or without the weight."""
    rng = random.Random(7)
    for _ in range(200):
        keys = [rng.randint(1, 66_000) for _ in range(rng.randint(2, 9))]
        slots = len(keys) * rng.randint(1, 8)
        for top_extra in (0, 4):
            check(keys, slots, top_extra)


def test_the_check_catches_a_broken_mirror(monkeypatch):
    """An uncapped weight leaves the top split of a short element empty: check says so."""
    real = locate

    def uncapped(keys, slots, slot, top_extra, n=N):
        got = real(keys, slots, slot, 0, n)
        if got is None or top_extra == 0:
            return got
        b, _, _, first, splits, k = got
        tiles = cdiv(keys[b], n)
        span = tiles + top_extra
        lo = k * span // splits
        hi = tiles if k + 1 == splits else (k + 1) * span // splits
        return b, min(lo, tiles) * n, min(hi * n, keys[b]), first, splits, k

    monkeypatch.setitem(globals(), "locate", uncapped)
    with pytest.raises(AssertionError):
        check([2048 + 9], 11, 8)
