"""The benchmark grid and its measurement, shared by the asv suite and scripts.

``measure_grid`` returns plain data (picklable, JSON-able) keyed by
``(heads, q_len, prefix_len, impl)``; the asv classes only look values up in it.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from . import build, cases, ops
from .machine import peaks
from .measure import measure_case
from .timer import Timer

HEADS = (8, 16, 64)
Q_LENS = (9, 17, 33, 65)
PREFIX_LENS = (0, 2048, 16384, 65536)
IMPLS = ops.IMPLS
FULL = {"heads": HEADS, "q_lens": Q_LENS, "prefix_lens": PREFIX_LENS, "impls": IMPLS}
CPU_FULL = {"heads": (8, 16), "q_lens": (9, 17), "prefix_lens": (0, 2048), "impls": IMPLS}
CPU_QUICK = {"heads": (8,), "q_lens": (9,), "prefix_lens": (0, 2048), "impls": ("naive", "flash")}
# The pull-request subset (asv -b Quick): the headline cases, naive and flash only.
QUICK = {"heads": (64,), "q_lens": (9,), "prefix_lens": (2048, 16384, 65536), "impls": ("naive", "flash")}
# Cold L2 matters where the cache rows fit in the 60 MiB L2: short prefixes.
COLD = {"heads": (64,), "q_lens": (9,), "prefix_lens": (2048, 16384), "impls": IMPLS}


def device() -> str:
    """The machine's default device, unless VERIFY_ATTN_DEVICE says otherwise."""
    return os.environ.get("VERIFY_ATTN_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def spec(variant: str = "full") -> dict:
    """What a variant (full, quick, cold) measures on this device.

    On the CPU everything shrinks to what 2 cores finish in minutes; VERIFY_ATTN_GRID=tiny
    (the end-to-end test) shrinks the full grid to two points.
    """
    cpu = device() != "cuda"
    if variant == "quick":
        return CPU_QUICK if cpu else QUICK
    if variant == "cold":
        return COLD if not cpu else {"heads": (), "q_lens": (), "prefix_lens": (), "impls": ()}
    if os.environ.get("VERIFY_ATTN_GRID") == "tiny":
        return CPU_QUICK
    return CPU_FULL if cpu else FULL


def grid(heads: int, variant: str = "full") -> list[tuple[int, int, str]]:
    """(q_len, prefix_len, impl) points measured for this number of heads."""
    s = spec(variant)
    if heads not in s["heads"]:
        return []
    return [(q, p, i) for q in s["q_lens"] for p in s["prefix_lens"] for i in s["impls"]]


def timer(cold: bool = False) -> Timer:
    if device() == "cuda":
        return Timer("cuda", samples=15, min_sample_s=2e-3, cold=cold)
    return Timer("cpu", samples=7, min_sample_s=0.02, warmup_s=0.0)


def progress(line: str) -> None:
    """To stderr, and appended to <cache>/progress.log for a terminal to follow while asv
    holds the benchmark's output until it ends."""
    print(line, file=sys.stderr, flush=True)
    path = build.cache_dir() / "progress.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def measure_grid(heads: int | None, variant: str = "full") -> dict:
    """Measure every grid point of ``heads`` (None: the variant's only head count) in this
    variant (full, quick, cold)."""
    if heads is None:
        heads = (spec(variant)["heads"] or (0,))[0]
    points = grid(heads, variant)
    dev = device()
    peak = peaks(dev)
    tm = timer(cold=variant == "cold")
    by_case: dict[tuple[int, int], list[str]] = {}
    for q_len, prefix, impl in points:
        by_case.setdefault((q_len, prefix), []).append(impl)
    out = {"device": dev, "heads": heads, "peaks": peak.__dict__, "results": {}}
    t0 = time.perf_counter()
    for n, ((q_len, prefix), impls) in enumerate(by_case.items(), 1):
        case = cases.grid_case(heads, q_len, prefix)
        for impl, r in measure_case(case, impls, tm).items():
            entry = {"ok": r.error.ok, "reason": r.error.reason, "max_rel": r.error.max_rel,
                     "flops": r.cost.flops, "bytes": r.cost.bytes,
                     "roofline_s": r.cost.roofline_s(peak.flops, peak.bytes_per_s)}
            if r.timing is not None:
                entry.update(samples=r.timing.samples, number=r.timing.number, median=r.timing.median,
                             sm_clock_mhz=r.timing.sm_clock_mhz, dropped=r.timing.dropped, naive_s=r.naive_s)
            out["results"][(heads, q_len, prefix, impl)] = entry
        progress(f"[verify_attn] {variant} heads={heads} case {n}/{len(by_case)} q_len={q_len} "
                 f"prefix_len={prefix} ({time.perf_counter() - t0:.0f} s)")
    return out
