"""tc_attn_tma's refill by the last reader (kernels/tc_wgmma_tma.cu): a model of the block's
start (Q and the masked tiles by cp.async from every thread, cleaned and masked, the first
unmasked tiles by TMA from thread 0) and of both consumer warpgroups, each of whose thread 0
issues the planes it has just freed of the stage's next tile, under a random scheduler
(tests/sync_model.py). Checked as in tests/test_refill.py: nothing is written while someone
reads it, nothing is read while a write to it is in flight, every read sees the tile (or P) it
was meant for, every arrival and transaction falls in its phase, no wait sees a barrier two
phases ahead, and the block finishes. Mutants of the scheme make it fail. No GPU: a change to
the kernel's synchronization must be mirrored here."""

import random
from dataclasses import dataclass

import pytest

from sync_model import Mbar, NamedBarriers, run, wait, wait_phase
from test_refill import planes_of


@dataclass(frozen=True)
class Scheme:
    planes_of: object = planes_of
    full_count: int = 2              # full[s]: one arrival a half
    refill_after_pv: bool = True     # WG1 refills stage 0 after its PV_a (not once its S_b is done)
    masked_arrivals: int = 2         # thread 0's plain arrivals on a masked tile's phase
    sync_after_clean: bool = True    # a block-wide barrier between the cleaning and the pairs


@dataclass(frozen=True)
class Block:
    ntiles: int
    nmasked: int   # the first tiles (at the tree rows): cp.async, cleaned, masked; <= 2
    T: int         # threads modelled, each one slice of a cp.async plane (thread 0 also issues TMA)


def simulate(blk, rng, scheme=Scheme()):
    T = blk.T
    full = [Mbar(scheme.full_count, "full[0]"), Mbar(scheme.full_count, "full[1]")]
    bars = NamedBarriers()
    content, readers, inflight = {}, {}, {}
    ops, seq, early = [], [0], [0]
    started = [False] * T  # threads done with the start

    def key(k):
        content.setdefault(k, [None] * T)
        readers.setdefault(k, [])
        inflight.setdefault(k, 0)
        return k

    def read_begin(who, k, want):
        key(k)
        assert inflight[k] == 0, f"{who} reads {k} while a write to it is in flight"
        assert all(v == want for v in content[k]), f"{who} reads {k}: {content[k]}, meant {want}"
        readers[k].append(who)

    def read_end(who, k, want):
        assert all(v == want for v in content[k]), f"{k} changed under {who}: {content[k]}, meant {want}"
        readers[k].remove(who)

    def reads(who, ks, want):
        for k in ks:
            read_begin(who, k, want)
        yield
        for k in ks:
            read_end(who, k, want)

    def write_issue(who, k):
        key(k)
        assert not readers[k], f"{who} writes {k} while {readers[k]} read it"
        inflight[k] += 1

    def write_land(k, slices, value):
        assert not readers[k], f"a write lands in {k} while {readers[k]} read it"
        inflight[k] -= 1
        for i in slices:
            content[k][i] = value

    def op(**kw):
        seq[0] += 1
        ops.append(dict(kw, seq=seq[0]))

    def cp_async(t, k, value):
        write_issue(f"thread {t} cp.async", k)
        op(cp=t, key=k, slices=[t], value=value)

    def tma(who, k, value, bar, use):
        write_issue(f"{who} TMA", k)
        early[0] += any(readers.get((k[0], p)) for p in range(9))
        op(cp=None, key=k, slices=range(T), value=value, bar=bar, use=use)

    def cp_pending(t):
        return any(o["cp"] == t for o in ops)

    def engine():  # lands one issued copy at a time, in any order
        while True:
            if ops:
                o = rng.choice(ops)
                ops.remove(o)
                write_land(o["key"], o["slices"], o["value"])
                if o.get("bar"):
                    o["bar"].complete_tx(1, o["use"])
            yield

    def generic_write(who, k, slices, value):
        write_issue(who, k)
        yield
        write_land(k, slices, value)

    def load_half(who, w, s, j):
        """planes_of(w, s) of tile j into stage s: the issuer's arrive.expect_tx, then its boxes."""
        planes, u = scheme.planes_of(w, s), j >> 1
        full[s].arrive(u, expect_tx=len(planes))
        for p in planes:
            tma(who, (s, p), j, full[s], u)
            yield

    def masked(j):
        return j < blk.nmasked

    def start(t):
        """tc_attn_tma before its pairs: thread t's part."""
        if blk.ntiles > 0:
            for p in range(9):
                cp_async(t, key(("q", p)), "Q")
        yield from bars.bar("A", t, True, T)  # the mbarriers initialised
        if t == 0:
            for j in range(blk.nmasked, min(2, blk.ntiles)):
                yield from load_half("thread 0", 0, j, j)
                yield from load_half("thread 0", 1, j, j)
        for j in range(blk.nmasked):
            for p in range(9):
                cp_async(t, (j, p), j)
                yield
        yield from wait(lambda: not cp_pending(t))  # cp.async.wait_all
        yield from bars.bar("B", t, True, T)
        if blk.nmasked:
            for j in range(blk.nmasked):
                for p in range(9):  # every thread reads and may rewrite chunks of every plane
                    k = (j, p)
                    assert not readers[k] and inflight[k] == 0 and all(v == j for v in content[k]), \
                        f"thread {t} cleans {k}: {content[k]}, readers {readers[k]}"
                    yield
                yield from generic_write(f"thread {t} mask", key((j, "mask")), [t], j)
            if scheme.sync_after_clean:
                yield from bars.bar("C", t, True, T)
            if t == 0:
                for j in range(blk.nmasked):
                    for _ in range(scheme.masked_arrivals):
                        full[j].arrive(0)
        started[t] = True

    def ready(w):
        """A consumer warpgroup's threads are past the start (the model's threads t of parity w
        stand for its 128; with the barrier after the cleaning, every thread is)."""
        return all(started) if scheme.sync_after_clean else all(started[t] for t in range(w, T, 2))

    Q = [("q", p) for p in range(9)]

    def stage(s, planes):
        return [(s, p) for p in planes]

    def softmax(who, s, j):
        if masked(j):
            yield from reads(who, [(s, "mask")], j)

    def wg0():
        yield from wait(lambda: ready(0))
        n = blk.ntiles
        for k in range((n + 1) // 2):
            a, b = 2 * k, 2 * k + 1
            has_b = b < n
            yield from wait_phase(full[0], k)
            yield from reads("WG0 S_a", Q, "Q")
            yield from reads("WG0 S_a", stage(0, range(9)), a)
            if has_b:
                yield from bars.bar("S0", 0, False)
            yield from softmax("WG0 softmax_a", 0, a)
            yield from generic_write("WG0 P_a", (0, 8), range(T), ("P", a))
            yield from bars.bar("P0", 0, False)
            yield from reads("WG0 PV_a", stage(0, range(4)), a)
            if a + 2 < n:
                yield from load_half("WG0", 0, 0, a + 2)
            if has_b:
                yield from bars.bar("P1", 0, True)
                yield from wait_phase(full[1], k)
                read_begin("WG0 PV_b", (1, 8), ("P", b))
                yield from reads("WG0 PV_b", stage(1, range(4)), b)
                read_end("WG0 PV_b", (1, 8), ("P", b))
                if b + 2 < n:
                    yield from load_half("WG0", 0, 1, b + 2)
        yield from bars.bar("End", 0, True)

    def wg1():
        yield from wait(lambda: ready(1))
        n = blk.ntiles
        for k in range((n + 1) // 2):
            a, b = 2 * k, 2 * k + 1
            if b < n:
                yield from bars.bar("S0", 1, True)
                yield from wait_phase(full[1], k)
                s_b = Q + stage(1, range(9))
                for kk in s_b[:9]:
                    read_begin("WG1 S_b", kk, "Q")
                for kk in s_b[9:]:
                    read_begin("WG1 S_b", kk, b)
                yield from bars.bar("P0", 1, True)
                yield from wait_phase(full[0], k)
                pv_a = stage(0, range(4, 8)) + [(0, 8)]
                for kk in pv_a[:4]:
                    read_begin("WG1 PV_a", kk, a)
                read_begin("WG1 PV_a", (0, 8), ("P", a))
                yield
                for kk in s_b[:9]:  # S_b done (wait_one), PV_a in flight
                    read_end("WG1 S_b", kk, "Q")
                for kk in s_b[9:]:
                    read_end("WG1 S_b", kk, b)
                if not scheme.refill_after_pv and a + 2 < n:
                    yield from load_half("WG1", 1, 0, a + 2)
                yield from softmax("WG1 softmax_b", 1, b)
                yield from generic_write("WG1 P_b", (1, 8), range(T), ("P", b))
                yield from bars.bar("P1", 1, False)
                yield
                for kk in pv_a[:4]:
                    read_end("WG1 PV_a", kk, a)
                read_end("WG1 PV_a", (0, 8), ("P", a))
                if scheme.refill_after_pv and a + 2 < n:
                    yield from load_half("WG1", 1, 0, a + 2)
                yield from reads("WG1 PV_b", stage(1, range(4, 8)), b)
                if b + 2 < n:
                    yield from load_half("WG1", 1, 1, b + 2)
            else:
                yield from bars.bar("P0", 1, True)
                yield from wait_phase(full[0], k)
                read_begin("WG1 PV_a", (0, 8), ("P", a))
                yield from reads("WG1 PV_a", stage(0, range(4, 8)), a)
                read_end("WG1 PV_a", (0, 8), ("P", a))
        yield from bars.bar("End", 1, True)

    run([start(t) for t in range(T)] + [wg0(), wg1()], rng, background=[engine()])
    assert [f.phase for f in full] == [(blk.ntiles + 1 - s) // 2 for s in (0, 1)]
    assert not ops
    return early[0]


def blocks(rng):
    ntiles = rng.choice([1, 2, 3, 4, 5, 6, 7, 9])
    return Block(ntiles, min(ntiles, rng.choice([0, 0, 1, 2])), rng.choice([1, 2, 3]))


@pytest.mark.parametrize("seed", range(60))
def test_refill_by_the_last_reader(seed):
    rng = random.Random(seed)
    for _ in range(8):
        simulate(blocks(rng), rng)


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
