"""What the asv suite measures, as plain data.

``measure_grid`` measures one selection of verify_attn.grid and returns plain data
(picklable) keyed by ``(heads, q_len, prefix_len, impl)``; the asv classes only look values
up in it. Each entry carries everything the reports need besides the timing: FLOPs, bytes,
the roofline time and the peaks it used, the median SM clock, the samples dropped for a low
clock, and the launch plan. ``measure_quick`` gates the pull-request subset on every named
case (verify_attn.parity) first.
"""

from __future__ import annotations

import os
import sys
import time

from . import anchor, build, candidate, cases, grid, parity, prebuild, registry, repeat
from .gpu import device  # decided without torch: the benchmark modules ask at import (verify_attn.gpu)
from .machine import peaks
from .measure import measure_case
from .timer import Timer


def selection(variant: str = "full"):
    """What a variant (full, quick, cold, chain, serving, serving_chain) measures on this device
    (VERIFY_ATTN_GRID=tiny: two points)."""
    table = "tiny" if os.environ.get("VERIFY_ATTN_GRID") == "tiny" else device()
    return grid.SELECTIONS.get(table, grid.SELECTIONS["cpu"])[variant]


def case_of(variant: str, point: tuple) -> cases.Case:
    """The case one point of a variant's selection measures: (heads, q_len, prefix_len) of the
    grid's variants, (batch, heads, q_len) of serving and serving_chain. The suite, ab, the
    profile and docs/twin_levels.py build their cases here, so all of them time the same."""
    sel = selection(variant)
    if variant.startswith("serving"):
        batch, heads, q_len = point
        return cases.serving_case(batch, heads, q_len, tree=sel.tree, paged=sel.paged, pad_to=sel.pad_to)
    heads, q_len, prefix = point
    return cases.grid_case(heads, q_len, prefix, tree=sel.tree, pad_to=sel.pad_to)


def point_name(variant: str, point: tuple) -> str:
    """A point as the tables name it: h64 q9 p65536, b8 h16 q9 for the serving variants."""
    return ("b{} h{} q{}" if variant.startswith("serving") else "h{} q{} p{}").format(*point)


def impls(variant: str = "full") -> list[str]:
    sel = selection(variant)
    chosen = registry.under_test() if sel.impls == "under_test" else registry.names()
    return [i for i in chosen if i not in sel.exclude]


def _entry(r, peak) -> dict:
    """What the asv classes and the reports read of one measured point."""
    entry = {"skipped": r.skipped, "flops": r.cost.flops, "bytes": r.cost.bytes,
             "roofline_s": r.cost.roofline_s(peak.flops, peak.bytes_per_s), "plan": r.plan,
             "anchor": r.anchor, "anchor_of": r.anchor_of}
    if r.error is not None:
        entry.update(ok=r.error.ok, reason=r.error.reason, max_rel=r.error.max_rel)
    if r.timing is not None:
        entry.update(samples=r.timing.samples, number=r.timing.number, median=r.timing.median,
                     sm_clock_mhz=r.timing.sm_clock_mhz, dropped=r.timing.dropped, baseline_s=r.baseline_s,
                     clock_screened=r.timing.clock_screened)
    return entry


# Quick's samples of a call over 0.1 s (naive at heads 64, prefix 65,536: 137 ms). Such a
# call's samples fall on steps of about 1 ms (0.7%), so a single pair with its twin scatters
# by about 1.5%, and seven pairs a start left the median 1.3-2.1% apart over five starts
# (docs/spread.md); Quick's goal is 1%. Odd: one ratio a round, as for every call over 20 ms
# (no order effect there: even rounds 0.9999, odd 0.9993 over 160d5b0's 22 such calls).
LONG_SAMPLES = 31


def timer(cold: bool = False, sample_s: float = 2e-3, samples: int = 16, long_samples: int = 0) -> Timer:
    """samples a variant (even: the drift-free series pairs two rounds, measure.paired_ratios)
    of at least sample_s each; 7 for a call over 20 ms (naive at long prefixes: 0.03-0.9 s a
    call, most of a full run), still enough for asv's test (p = 0.0006 at 7 against 7);
    long_samples (Quick: LONG_SAMPLES) for a call over 0.1 s."""
    if device() == "cuda":
        return Timer("cuda", samples=samples, min_sample_s=sample_s, cold=cold, slow_call_s=0.02, slow_samples=7,
                     long_call_s=0.1, long_samples=long_samples)
    return Timer("cpu", samples=7, min_sample_s=0.02, warmup_s=0.0)


def gated() -> list[str]:
    """What the named-case gate checks before Quick's timings (and ab's): every kernel under
    test, the pinned paths Quick does not time (verify_attn.grid.GATED_ONLY) included."""
    return list(registry.under_test())


def needs(variant: str) -> tuple[str, ...]:
    """The libraries a variant's measurement loads (verify_attn.prebuild)."""
    return ("extension", "anchor") + (("flashmla",) if "flashmla" in impls(variant) else ())


def anchored() -> str | None:
    """The anchor's namespace once its build is loaded (verify_attn.anchor), or None, said once."""
    ns, note = anchor.load()
    if ns is None and not anchor._state.get("said"):
        progress(f"[verify_attn] no drift-free series: {note}")
        anchor._state["said"] = True
    return ns


def progress(line: str) -> None:
    """To stderr, and appended to <cache>/progress.log for a terminal to follow while asv
    holds the benchmark's output until it ends."""
    print(line, file=sys.stderr, flush=True)
    path = build.cache_dir() / "progress.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def measure_grid(heads: tuple[int, ...] | None, variant: str = "full", timed: bool = True,
                 only: dict | None = None) -> dict:
    """Measure every point of the variant's selection at these head counts (None: all of the
    selection's); timed=False checks every point and times none; only ({point: [impl, ...]}):
    just those implementations at just those points (verify_attn.repeat's processes)."""
    prebuild.start(needs(variant))
    sel = selection(variant)
    points = [pt for pt in sel.points() if (heads is None or pt[0] in heads) and (only is None or pt in only)]
    heads = tuple(sorted({h for h, _, _ in points})) if heads is None else tuple(heads)
    dev = device()
    peak = peaks(dev)
    tm = timer(cold=variant == "cold", long_samples=LONG_SAMPLES if variant == "quick" else 0)
    out = {"device": dev, "heads": heads or (0,), "peaks": peak.__dict__, "results": {}}
    t0 = time.perf_counter()
    for n, (h, q_len, prefix) in enumerate(points, 1):
        case = case_of(variant, (h, q_len, prefix))
        chosen = impls(variant) if only is None else only[(h, q_len, prefix)]
        left_out = {i: grid.not_run(i, h, q_len, prefix) for i in chosen}
        run = [i for i, why in left_out.items() if not why]
        for impl, r in measure_case(case, run, tm, timed=timed, anchor_ns=anchored() if timed else None).items():
            out["results"][(h, q_len, prefix, impl)] = _entry(r, peak)
        for impl, why in left_out.items():
            if why:
                out["results"][(h, q_len, prefix, impl)] = {"skipped": why}
        progress(f"[verify_attn] {variant} heads={h} case {n}/{len(points)} q_len={q_len} "
                 f"prefix_len={prefix} ({time.perf_counter() - t0:.0f} s)")
    return out


def repeat_workers(limits: dict | None = None) -> repeat.Workers:
    """This device's repeat processes (verify_attn.repeat) of these limits (LIMITS, or Quick's
    QUICK_LIMITS), started now so that they load while this process measures; a context
    manager. None with the anchor off: only drift-free series are repeated."""
    return repeat.Workers({} if anchor.commit() == "off" else (limits or repeat.LIMITS).get(device(), {}))


def repeat_short(measured: dict, workers: repeat.Workers) -> None:
    """Time the short points of these measurements ({variant: measure_grid's result}) again in
    the workers (repeat_workers) and pool them in, one set of processes for them all."""
    if not anchored():
        return
    t0 = time.perf_counter()
    counts = repeat.extend({v: m["results"] for v, m in measured.items()}, workers)
    if any(counts):
        progress(f"[verify_attn] {', '.join(measured)}: short points timed again, {'+'.join(map(str, counts))} in "
                 f"{len(counts)} more processes ({time.perf_counter() - t0:.0f} s)")


def measure_quick() -> dict:
    """The pull-request subset: every named case of this device (verify_attn.parity) for the
    gated implementations first, under "named" keyed (case, impl); then the selection's
    points, which are checked but not timed if any named case failed ("untimed" says why),
    so the subset's timings fail however fast the break made them. Short calls are timed
    again in the repeat processes (repeat_short), which load while the gate runs."""
    dev = device()
    prebuild.start(needs("quick"))
    with repeat_workers(repeat.QUICK_LIMITS) as workers:  # loading while the gate runs
        return _measure_quick(dev, workers)


def _measure_quick(dev: str, workers: repeat.Workers) -> dict:
    t0 = time.perf_counter()
    checked, seen = [], None
    for case, o in parity.gate(dev, candidate.of(gated())):
        if case.name != seen:
            seen = case.name
            progress(f"[verify_attn] quick: named case {case.name} ({time.perf_counter() - t0:.0f} s)")
        checked.append((case, o))
    named = {(case.name, o.impl): {"skipped": o.skipped} if o.error is None else {
        "skipped": "", "ok": o.error.ok, "reason": o.error.reason, "max_rel": o.error.max_rel} for case, o in checked}
    failed = parity.failures(checked)
    progress(f"[verify_attn] quick: {len(named)} named checks, {len(failed)} failed ({time.perf_counter() - t0:.0f} s)")
    untimed = f"not timed: named cases failed: {'; '.join(failed)}" if failed else ""
    out = measure_grid(None, "quick", timed=not failed)
    repeat_short({"quick": out}, workers)
    return out | {"named": named, "untimed": untimed}


def measure_serving(variant: str = "serving") -> dict:
    """Measure every serving step of this device's selection of the variant (serving or
    serving_chain), keyed (batch, heads, q_len, impl)."""
    prebuild.start(needs(variant))
    sel = selection(variant)
    peak = peaks(device())
    # A serving step takes 0.3-2 ms: samples of 1-3 calls left tc's pairs 1-3% apart from one
    # machine start to the next; 10 ms samples average 5-30 calls.
    tm = timer(sample_s=10e-3)
    out = {"device": device(), "peaks": peak.__dict__, "results": {}}
    t0 = time.perf_counter()
    for n, (batch, heads, q_len) in enumerate(sel.points(), 1):
        case = case_of(variant, (batch, heads, q_len))
        for impl, r in measure_case(case, impls(variant), tm, anchor_ns=anchored()).items():
            out["results"][(batch, heads, q_len, impl)] = _entry(r, peak)
        progress(f"[verify_attn] {variant} case {n}/{len(sel.points())} batch={batch} heads={heads} q_len={q_len} "
                 f"({time.perf_counter() - t0:.0f} s)")
    return out
