"""Where a call's time goes in a stream: each implementation's kernels as the timer runs them.

    python -m verify_attn stream [--impl tc flashmla] [--points chain:8:9:65536 ..] [--calls 40] [--json FILE]

At each point every implementation is checked against the float64 reference first, then run
as a timed sample runs it (a spin while the host enqueues, back-to-back calls over input sets
rotating past twice the L2), under the CUDA profiler (CUPTI through torch.profiler). Per
implementation: the call's time by CUDA events, and per kernel its duration a call (median,
min-max) and how long after the latest end of the kernels before it it starts (negative: the
grids overlap, as programmatic dependent launch allows). Nsight Compute (`crosscheck`, `ab --source`)
times one kernel at a time with the caches flushed; here a merge runs behind its attention
grid with its partials in the L2, and a peer's combine may start before its main kernel ends.
Default points: Quick's; default implementations: tc and FlashMLA (skipped where unavailable).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from .cli import Refusal, bounded, need_gpu, parser, refusing

SPIN = "spin_kernel"  # the timer's wait kernel (torch.cuda._sleep), not a call's
FAILED = "fails its check"


def kernels_of(events) -> list[tuple[float, float, str]]:
    """(start us, end us, kernel name) of the profiler's device kernels, in start order: copies,
    sets and the timer's spin left out."""
    import torch

    out = []
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name
        if name.startswith(("Memcpy", "Memset")) or SPIN in name:
            continue
        out.append((float(e.time_range.start), float(e.time_range.end), name))
    return sorted(out)


def short_name(kernel: str) -> str:
    """A CUPTI kernel name without namespace, template arguments and parameters (CUPTI writes
    an unnamed namespace as "(anonymous namespace)", Nsight Compute as "<unnamed>")."""
    from verify_attn.profile import kernel_name

    return kernel_name(kernel.replace("(anonymous namespace)", "<unnamed>"))


def summarise(kernels: list[tuple[float, float, str]], calls: int) -> dict:
    """Per kernel (short name, in order of first start): launches a call, duration median / min
    / max in us, and the gap from the latest end of the kernels that started before it to its
    start (negative: it started while one of them ran), median / min / max."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    rows: dict[str, dict] = {}
    busy_until = None  # the latest end so far: a kernel inside a longer one does not end the overlap
    for start, end, name in kernels:
        row = rows.setdefault(short_name(name), {"durations": [], "gaps": []})
        row["durations"].append(end - start)
        if busy_until is not None:
            row["gaps"].append(start - busy_until)
        busy_until = end if busy_until is None else max(busy_until, end)

    def stats(values):
        return {"median_us": statistics.median(values), "min_us": min(values), "max_us": max(values)} if values else None

    return {"kernels": [{"name": name, "per_call": len(r["durations"]) / calls, "duration": stats(r["durations"]),
                         "gap_before": stats(r["gaps"])} for name, r in rows.items()]}


def table(point: str, device: str, calls: int, results: dict) -> str:
    """A point's markdown: one row per kernel, the call's event time on its implementation's first."""
    lines = [f"### {point} ({device}; {calls} calls back to back, kernels by CUPTI)", "",
             "| impl | call us (events) | kernel | launches a call | us a kernel: median (min-max) | "
             "starts after the kernels before it end, us |",
             "| --- | ---: | --- | ---: | --- | --- |"]
    for impl, r in results.items():
        if "skipped" in r:
            lines.append(f"| {impl} | - | skipped: {r['skipped']} | | | |")
            continue
        for k, kern in enumerate(r["kernels"]):
            d, g = kern["duration"], kern["gap_before"]
            gap = f"{g['median_us']:.2f} ({g['min_us']:.2f} to {g['max_us']:.2f})" if g else "-"
            first = (impl, f"{r['call_us']:.2f}") if k == 0 else ("", "")
            lines.append(f"| {first[0]} | {first[1]} | {kern['name']} | {kern['per_call']:g} | "
                         f"{d['median_us']:.2f} ({d['min_us']:.2f}-{d['max_us']:.2f}) | {gap} |")
    return "\n".join(lines)


def run_point(variant: str, point: tuple, impls: list[str], calls: int, device: str = "cuda") -> dict:
    """Every implementation at one point: checked, warmed up, then `calls` calls profiled (device
    "cpu": the tests', where everything up to the CUDA profiler runs and it refuses)."""
    from torch.profiler import ProfilerActivity, profile

    from verify_attn import candidate, measure, suite
    from verify_attn.timer import Timer

    timer = Timer(device)
    sets = measure.input_sets(suite.case_of(variant, point), device, 0)
    out = {}
    for o in candidate.outcomes(sets[0], candidate.of(impls), candidate.ReferenceOf(sets[0])):
        impl = o.candidate.impl
        if o.skipped or not o.error.ok:
            out[impl] = {"skipped": o.skipped or f"{FAILED}: {o.error.reason}"}
            continue
        fns = [candidate.prepare(o.candidate, s) for s in sets]
        # The timer's own phases: its warm-up (which also gives the host's enqueue time a call),
        # then one sample of `calls` calls (the spin, events around them), under the profiler.
        _, host, _ = timer._calibrate(fns)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                per_call = timer._sample(fns, calls, 0, host)
        except AssertionError as exc:  # torch's profiler with no CUDA activity to record
            raise Refusal(f"the CUDA profiler did not start ({exc})") from None
        kern = kernels_of(prof.events())
        if not kern:
            raise Refusal("the profiler saw no kernels (CUPTI unavailable in this torch build?)")
        out[impl] = {"call_us": per_call * 1e6, **summarise(kern, calls)}
        del fns
    return out


def arguments(argv):
    from verify_attn import registry

    from .ab import source_point

    p = parser("stream", __doc__)
    p.add_argument("--impl", nargs="+", action="extend", choices=registry.names(),
                   help="default: tc and flashmla")
    p.add_argument("--points", nargs="+", type=source_point, metavar="SEL:H:Q:P",
                   help="points of the grid's selections (e.g. chain:8:9:65536; serving ones SEL:B:H:Q); "
                        "default: Quick's")
    p.add_argument("--calls", type=bounded(2, 10_000), default=40, help="calls profiled back to back (default 40)")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Exit 0, 1 where an implementation failed its check, 2 refused (no GPU, nothing ran)."""
    return refusing("stream", run, argv)


def run(argv) -> int:
    args = arguments(argv)
    need_gpu("stream")
    import torch

    from verify_attn import ops, suite

    ops.load()
    points = args.points or [("quick", pt) for pt in suite.selection("quick").points()]
    impls = list(dict.fromkeys(args.impl or ["tc", "flashmla"]))
    device = torch.cuda.get_device_name()
    report = []
    for variant, point in points:
        name = f"{variant} {suite.point_name(variant, point)}"
        print(f"# {name}", file=sys.stderr, flush=True)
        results = run_point(variant, point, impls, args.calls)
        print(table(name, device, args.calls, results) + "\n", flush=True)
        report.append({"selection": variant, "point": list(point), "device": device, "calls": args.calls,
                       "impls": results})
        if args.json:  # after each point: a refusal at a later one keeps what ran
            args.json.write_text(json.dumps(report, indent=1))
    return verdict(report)


def verdict(report: list[dict]) -> int:
    """1 where an implementation failed its check (the run's news, whatever else ran), else 0 if
    anything ran; a refusal (exit 2) where every implementation was skipped."""
    results = [r for point in report for r in point["impls"].values()]
    if any(r.get("skipped", "").startswith(FAILED) for r in results):
        return 1
    if all("skipped" in r for r in results):
        raise Refusal("nothing ran: every implementation was skipped (" +
                      "; ".join(sorted({r["skipped"] for r in results})) + ")")
    return 0
