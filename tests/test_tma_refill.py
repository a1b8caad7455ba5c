"""tc_attn_tma's refill by the last reader (kernels/tc_wgmma_tma.cu; tc_attn_tma_deal's pieces one
after another: simulate_pieces): a model of the block's start (Q and the masked tiles by
cp.async from every thread, cleaned and masked, the first unmasked tiles by TMA from thread 0)
and of both consumer warpgroups, each of whose thread 0 issues the planes it has just freed of
the stage's next tile, under a random scheduler (tests/sync_model.py). Checked as in
tests/test_refill.py: nothing is written while someone reads it, nothing is read while a write
to it is in flight, every read sees the tile (or P) it was meant for, every arrival and
transaction falls in its phase, no wait sees a barrier two phases ahead, and the block
finishes. Mutants of the scheme make it fail. No GPU: a change to the kernel's synchronization
must be mirrored here."""

import random
from dataclasses import dataclass

import pytest

from sync_model import Mbar, NamedBarriers, Smem, consumers, run, wait
from test_refill import planes_of


@dataclass(frozen=True)
class Scheme:
    planes_of: object = planes_of
    full_count: int = 2              # full[s]: one arrival a half
    refill_after_pv: bool = True     # WG1 refills stage 0 after its PV_a (not once its S_b is done)
    masked_arrivals: int = 2         # thread 0's plain arrivals on a masked tile's phase
    sync_after_clean: bool = True    # a block-wide barrier between the cleaning and the pairs
    carry_uses: bool = True          # a piece's consumers count the stages' uses by earlier pieces
    halves: bool = False             # tc_attn_tma: a barrier a half (one arrival), WG0's S in two parts
    wg1_waits_own_half: bool = True  # (halves) WG1's PV_a waits for planes_of(1, 0), not WG0's half


@dataclass(frozen=True)
class Block:
    ntiles: int
    nmasked: int   # the first tiles (at the tree rows): cp.async, cleaned, masked; <= 2
    T: int         # threads modelled, each one slice of a cp.async plane (thread 0 also issues TMA)


def simulate(blk, rng, scheme=Scheme()):
    return simulate_pieces([blk], rng, scheme)


def simulate_pieces(blks, rng, scheme=Scheme()):
    """The ranges blks one after another in one block (tc_attn_tma_deal's pieces; one range:
    tc_attn_tma): the mbarriers, named barriers and shared memory carry over, the stages' uses
    are counted over the block, a piece's tiles and Q are told apart from the last piece's."""
    T = blks[0].T
    full = [Mbar(scheme.full_count, "full[0]"), Mbar(scheme.full_count, "full[1]")]
    if scheme.halves:  # halves[s][w]: planes_of(w, s)
        full = [[Mbar(1, f"half[{s}][{w}]") for w in (0, 1)] for s in (0, 1)]
    bars = NamedBarriers()
    m = Smem(T, rng)  # the planes, masks and Q; the copies in flight
    uses = [0, 0]  # each stage's uses by the earlier pieces
    for n, blk in enumerate(blks):
        simulate_piece(n, blk, T, full, bars, m, uses, rng, scheme)
        uses = [uses[s] + (blk.ntiles + 1 - s) // 2 for s in (0, 1)]
        if scheme.halves:
            assert [[h.phase for h in full[s]] for s in (0, 1)] == [[uses[s]] * 2 for s in (0, 1)]
        else:
            assert [f.phase for f in full] == uses
        assert not m.ops, "a copy of the piece still in flight at its end"
    assert not m.ops
    return m.early


def simulate_piece(n, blk, T, full, bars, m, uses, rng, scheme):
    started = [False] * T  # threads done with the start
    key, generic_write, readers, inflight, content = m.key, m.generic_write, m.readers, m.inflight, m.content

    def tag(j):  # what tile j of this piece holds
        return (n, j)

    def cp_async(t, k, value):
        m.cp_async(f"thread {t} cp.async", t, k, value)

    def load_half(who, w, s, j):
        """planes_of(w, s) of tile j into stage s: the issuer's arrive.expect_tx, then its boxes."""
        planes, u = scheme.planes_of(w, s), uses[s] + (j >> 1)
        bar = full[s][w] if scheme.halves else full[s]
        bar.arrive(u, expect_tx=len(planes))
        for p in planes:
            m.tma(f"{who} TMA", (s, p), tag(j), bar, u)
            yield

    def masked(j):
        return j < blk.nmasked

    def start(t):
        """tc_attn_tma's start_range: thread t's part."""
        if blk.ntiles > 0:
            for p in range(9):
                cp_async(t, key(("q", p)), ("Q", n))
        yield from bars.bar("A", t, True, T)  # the mbarriers initialised (an earlier piece's End passed)
        if t == 0:
            for j in range(blk.nmasked, min(2, blk.ntiles)):
                yield from load_half("thread 0", 0, j, j)
                yield from load_half("thread 0", 1, j, j)
        for j in range(blk.nmasked):
            for p in range(9):
                cp_async(t, (j, p), tag(j))
                yield
        yield from wait(lambda: not m.cp_pending(t))  # cp.async.wait_all
        yield from bars.bar("B", t, True, T)
        if blk.nmasked:
            for j in range(blk.nmasked):
                for p in range(9):  # every thread reads and may rewrite chunks of every plane
                    k = (j, p)
                    assert not readers[k] and inflight[k] == 0 and all(v == tag(j) for v in content[k]), \
                        f"thread {t} cleans {k}: {content[k]}, readers {readers[k]}"
                    yield
                yield from generic_write(f"thread {t} mask", key((j, "mask")), [t], tag(j))
            if scheme.sync_after_clean:
                yield from bars.bar("C", t, True, T)
            if t == 0:
                for j in range(blk.nmasked):
                    for w in range(scheme.masked_arrivals):
                        (full[j][w] if scheme.halves else full[j]).arrive(uses[j])
        started[t] = True

    def ready(w):
        """A consumer warpgroup's threads are past the start (the model's threads t of parity w
        stand for its 128; with the barrier after the cleaning, every thread is)."""
        return all(started) if scheme.sync_after_clean else all(started[t] for t in range(w, T, 2))

    def release(w, s, j):  # warpgroup w's thread 0 refills what it freed
        if j + 2 < blk.ntiles and (scheme.refill_after_pv or (w, s) != (1, 0)):
            yield from load_half(f"WG{w}", w, s, j + 2)

    def refill_after_s_b(a):  # the mutant: WG1 refills stage 0 once its S_b is done
        if not scheme.refill_after_pv and a + 2 < blk.ntiles:
            yield from load_half("WG1", 1, 0, a + 2)

    def start_pairs(w):
        yield from wait(lambda: ready(w))

    halves = None
    if scheme.halves:
        halves = full if scheme.wg1_waits_own_half else [[full[0][0], full[0][0]], full[1]]
    wg0, wg1 = consumers(blk.ntiles, full, bars, m, masked, release, start_pairs, refill_after_s_b,
                         uses=tuple(uses) if scheme.carry_uses else (0, 0), tag=tag, q=("Q", n), halves=halves)
    # The piece ends on the End barrier (256 threads): the next piece's start follows it.
    run([start(t) for t in range(T)] + [wg0, wg1], rng, background=[m.engine()])


def blocks(rng):
    ntiles = rng.choice([1, 2, 3, 4, 5, 6, 7, 9])
    return Block(ntiles, min(ntiles, rng.choice([0, 0, 1, 2])), rng.choice([1, 2, 3]))


@pytest.mark.parametrize("seed", range(60))
def test_refill_by_the_last_reader(seed):
    rng = random.Random(seed)
    for _ in range(8):
        simulate(blocks(rng), rng)


@pytest.mark.parametrize("seed", range(30))
def test_pieces_carry_the_phases(seed):
    """tc_attn_tma_deal: pieces of odd and even tile counts, masked or not, one after another."""
    rng = random.Random(seed)
    for _ in range(4):
        T = rng.choice([1, 2, 3])
        simulate_pieces([Block(b.ntiles, b.nmasked, T) for b in (blocks(rng) for _ in range(rng.randint(2, 4)))], rng)


def test_the_pieces_model_catches_lost_phases():
    """Consumers that restart the stages' phases at every piece (tc_attn_tma_deal without ph)."""
    rng = random.Random(2)
    failed = 0
    for _ in range(20):
        try:
            simulate_pieces([Block(3, 1, 2), Block(4, 0, 2), Block(5, 2, 2)], rng, Scheme(carry_uses=False))
        except AssertionError:
            failed += 1
    assert failed > 0


@pytest.mark.parametrize("seed", range(40))
def test_halves(seed):
    """tc_attn_tma's halves: a barrier a half, WG0's S of a tile in two parts (planes 0-3 behind
    the previous pair's PV_b)."""
    rng = random.Random(seed)
    for _ in range(8):
        simulate(blocks(rng), rng, Scheme(halves=True))


@pytest.mark.parametrize("scheme", [Scheme(halves=True, wg1_waits_own_half=False),
                                    Scheme(halves=True, masked_arrivals=1)],
                         ids=["WG1-waits-WG0s-half", "one-masked-half"])
def test_the_model_catches_broken_halves(scheme):
    rng = random.Random(3)
    failed = 0
    for _ in range(300):
        ntiles = rng.choice([3, 4, 5, 7])
        nmasked = rng.choice([1, 2]) if scheme.masked_arrivals != 2 else rng.choice([0, 1])
        try:
            simulate(Block(ntiles, nmasked, rng.choice([1, 2])), rng, scheme)
        except AssertionError:
            failed += 1
    assert failed > 0


def test_the_refill_overlaps_the_reads():
    """The schedules reach what the scheme is for: a half of a stage loading while the other
    warpgroup still reads the other half."""
    rng = random.Random(0)
    assert sum(simulate(Block(8, 0, 2), rng) for _ in range(50)) > 0


def _wrong_rope(w, s):  # plane 8 of stage 0 (P_a, which WG1 still reads) in WG0's half
    return list(range(4 * w, 4 * w + 4)) + ([8] if (s == 0) == (w == 0) else [])


@pytest.mark.parametrize("scheme", [Scheme(planes_of=_wrong_rope), Scheme(full_count=1),
                                    Scheme(refill_after_pv=False), Scheme(masked_arrivals=1),
                                    Scheme(sync_after_clean=False)],
                         ids=["rope-plane-to-WG0", "one-arrival-a-tile", "WG1-refills-after-S_b",
                              "one-masked-arrival", "no-barrier-after-cleaning"])
def test_the_model_catches_a_broken_scheme(scheme):
    """Each mutant of the scheme fails on some random schedule of these blocks."""
    rng = random.Random(1)
    failed = 0
    for _ in range(300):
        ntiles = rng.choice([3, 4, 5, 7])
        masks = scheme.masked_arrivals != 2 or not scheme.sync_after_clean  # the mutants of the start
        nmasked = rng.choice([1, 2]) if masks else 0
        try:
            simulate(Block(ntiles, nmasked, rng.choice([2, 3]) if masks else rng.choice([1, 2])), rng, scheme)
        except AssertionError:
            failed += 1
    assert failed > 0
