"""tc_attn_ws's early refill by halves (kernels/tc_wgmma_ws.h, "Early refill"; the producer in
kernels/tc_wgmma_ws.cu): a model of the producer's threads, both consumer warpgroups and the
copies in flight, plane by plane, under a random scheduler (tests/sync_model.py). Checked:
nothing (a stage's planes, its masks, Q) is written while someone reads it, nothing is read
while a write to it is in flight, every read sees the tile (or P) it was meant for, every
mbarrier arrival and transaction falls in the phase it is meant for, no wait sees a barrier two
phases ahead, and the block finishes. Mutants of the scheme make it fail. No GPU: a change to
the kernel's synchronization must be mirrored here."""

import random
from dataclasses import dataclass

import pytest

from sync_model import Mbar, NamedBarriers, Smem, consumers, run, wait, wait_phase


def planes_of(w, s):
    """The planes that only consumer w still reads when it releases stage s: its V half (planes
    4w..4w+3), and the rope plane where the tile is the peer's (its P is there)."""
    return list(range(4 * w, 4 * w + 4)) + ([8] if s != w else [])


@dataclass(frozen=True)
class Scheme:
    planes_of: object = planes_of
    expect_whole_tile: bool = True   # thread 0's arrive.expect_tx posts all 9 planes' bytes
    cp_waits_both: bool = True       # a cp.async tile waits for WG1's release too
    rest_wait: bool = True           # the other producer threads wait for WG0's release on a TMA tile


@dataclass(frozen=True)
class Block:
    ntiles: int
    nmasked: int   # the first tiles (at the tree rows): cp.async, cleaned, masked
    tma: bool      # a contiguous cache: the other tiles by TMA
    rest: int      # producer threads modelled besides thread 0 (each one slice of a cp.async plane)


def simulate(blk, rng, scheme=Scheme(), p1_wait=True):
    T = 1 + blk.rest
    full = [Mbar(T, "full[0]"), Mbar(T, "full[1]")]
    empty = [[Mbar(1, "empty[0]"), Mbar(1, "empty[1]")], [Mbar(1, "empty1[0]"), Mbar(1, "empty1[1]")]]  # [w][s]
    bars = NamedBarriers()
    m = Smem(T, rng)  # the planes, masks and Q; the copies in flight
    key, generic_write = m.key, m.generic_write
    readers, inflight, content, cp_pending = m.readers, m.inflight, m.content, m.cp_pending

    def cp_async(pt, k, value):
        m.cp_async(f"producer {pt} cp.async", pt, k, value)

    def tma(k, value, bar, use):
        m.tma("producer 0 TMA", k, value, bar, use)

    def masked(j):
        return j < blk.nmasked

    def by_tma(j):
        return blk.tma and not masked(j)

    def producer(pt):
        if blk.ntiles > 0:
            for p in range(9):
                cp_async(pt, key(("q", p)), "Q")
        yield from bars.bar("Prod", pt, True, T)  # the parents staged
        for j in range(blk.ntiles):
            s, u = j & 1, j >> 1
            if j >= 2 and (pt == 0 or scheme.rest_wait or not by_tma(j)):
                yield from wait_phase(empty[0][s], u - 1)  # WG0's release of tile j - 2
            if by_tma(j):
                if j == 0:  # Q's copies before the first arrival (cp.async.wait_all)
                    yield from wait(lambda: not cp_pending(pt))
                if pt == 0:
                    first, second = scheme.planes_of(0, s), scheme.planes_of(1, s)
                    assert sorted(first + second) == list(range(9))
                    full[s].arrive(u, expect_tx=9 if scheme.expect_whole_tile else len(first))
                    for p in first:
                        tma((s, p), j, full[s], u)
                        yield
                    if j >= 2:
                        yield from wait_phase(empty[1][s], u - 1)
                    for p in second:
                        tma((s, p), j, full[s], u)
                        yield
                else:
                    full[s].arrive(u)
                yield
                continue
            if j >= 2 and scheme.cp_waits_both:
                yield from wait_phase(empty[1][s], u - 1)
            for p in range(9):
                cp_async(pt, (s, p), j)
                yield
            if masked(j):
                # Wait for the tile, clean it (every thread reads and may rewrite chunks of every
                # plane) and write its masks, then arrive.
                yield from wait(lambda: not cp_pending(pt))
                yield from bars.bar("Prod", pt, True, T)
                for p in range(9):
                    k = (s, p)
                    assert not readers[k] and inflight[k] == 0 and all(v == j for v in content[k]), \
                        f"producer {pt} cleans {k}: {content[k]}, readers {readers[k]}"
                    yield
                yield from generic_write(f"producer {pt} mask", key((s, "mask")), [pt], j)
                full[s].arrive(u)
            else:
                m.arrive_cp_async(pt, full[s], u)
            yield

    def release(w, s, j):  # empty[s] (WG0) or empty1[s] (WG1), for the producer
        empty[w][s].arrive(j >> 1)
        yield

    wg0, wg1 = consumers(blk.ntiles, full, bars, m, masked, release, p1_wait=p1_wait)
    run([producer(pt) for pt in range(T)] + [wg0, wg1], rng, background=[m.engine()])
    uses = [(blk.ntiles + 1 - s) // 2 for s in (0, 1)]
    assert [f.phase for f in full] == uses
    assert [[e.phase for e in ew] for ew in empty] == [uses, uses]
    assert not m.ops
    return m.early


def blocks(rng):
    ntiles = rng.choice([1, 2, 3, 4, 5, 6, 7, 9])
    return Block(ntiles, rng.choice([0, 0, 1, 2, ntiles]) if rng.random() < 0.8 else rng.randrange(ntiles + 1),
                 rng.random() < 0.75, rng.choice([1, 2, 3]))


@pytest.mark.parametrize("seed", range(60))
def test_refill_by_halves(seed):
    rng = random.Random(seed)
    for _ in range(8):
        simulate(blocks(rng), rng)


def test_the_refill_overlaps_the_reads():
    """The schedules do reach what the scheme is for: a half of a stage loading while the
    other warpgroup still reads the other half."""
    rng = random.Random(0)
    assert sum(simulate(Block(8, 0, True, 2), rng) for _ in range(50)) > 0


def test_planes_of_partitions_each_stage():
    for s in (0, 1):
        assert sorted(planes_of(0, s) + planes_of(1, s)) == list(range(9))
    assert planes_of(0, 0) == [0, 1, 2, 3] and planes_of(1, 0) == [4, 5, 6, 7, 8]
    assert planes_of(0, 1) == [0, 1, 2, 3, 8] and planes_of(1, 1) == [4, 5, 6, 7]


def _wrong_rope(w, s):  # plane 8 of stage 0 (P_a, which WG1 still reads) in WG0's half
    return list(range(4 * w, 4 * w + 4)) + ([8] if (s == 0) == (w == 0) else [])


@pytest.mark.parametrize("scheme", [Scheme(planes_of=_wrong_rope), Scheme(expect_whole_tile=False),
                                    Scheme(cp_waits_both=False), Scheme(rest_wait=False)],
                         ids=["rope-plane-to-WG0", "first-half-bytes-only", "cp-async-after-WG0", "rest-no-wait"])
def test_the_model_catches_a_broken_scheme(scheme):
    """Each mutant of the scheme fails on some random schedule of these blocks."""
    rng = random.Random(1)
    failed = 0
    for _ in range(300):
        ntiles, rest = rng.choice([3, 4, 5, 7]), rng.choice([1, 2])
        # the cp.async mutant on tiles by cp.async alone, the others on TMA tiles
        blk = Block(ntiles, 0, True, rest) if scheme.cp_waits_both else Block(ntiles, ntiles, False, rest)
        try:
            simulate(blk, rng, scheme)
        except AssertionError:
            failed += 1
    assert failed > 0


def test_the_model_checks_the_maxima_handoff():
    """The row maxima and factors a consumer posts (s_m, s_sc) reach the peer through P0 / P1
    (bar.arrive by the writer, bar.sync by the reader), and the next post overwrites them only
    after the peer read them: every schedule above checks both. racecheck reports this handoff
    (docs/tc.md); the model says what the barriers order. A reader that does not wait on P1
    reads a stale post on some schedule."""
    rng = random.Random(2)
    failed = 0
    for _ in range(200):
        try:
            simulate(Block(rng.choice([2, 4, 5]), 0, True, 1), rng, p1_wait=False)
        except AssertionError as e:
            failed += "m_b" in str(e)
    assert failed > 0
