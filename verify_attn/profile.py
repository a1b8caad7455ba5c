"""The hardware's account of Quick's points: Nsight Compute (ncu) over the kernels under test.

What. Every point of Quick's selection on this device (verify_attn.grid) for ``impls()``: the
kernels under test that run on the GPU, pinned-path variants included (tc, flash, tc_mma).
naive, the baseline, is left out: nobody tunes it, and its chunked calls at prefix 65,536
(15 launches, 140 ms a call) would take half the budget under replay. The inputs are Quick's
(suite.case_of, seed 0: the first of the input sets Quick rotates), checked and prepared
through verify_attn.candidate; a candidate that fails its check or does not take the point
is skipped with the reason. The command line takes another variant's points and other
implementations, a peer beside tc: `python -m verify_attn.profile --variant chain --points
8:9:65536 --impls tc,flashmla` (FlashMLA only runs chain trees).

How. ONE ncu process runs this module as its target (``--target``): per point and
implementation one warm-up call, then one call inside the NVTX push/pop range
"va-profile:H:Q:P:IMPL", nested in the range "verify_attn.profile" that ncu's filter takes
(``--nvtx-include verify_attn.profile/``); checks, warm-ups and input making are not
profiled. The report's raw page is read twice (verify_attn.ncu): as it is (kernel names) and
with each kernel renamed to its innermost range; the launch IDs join the two, so every kernel
of a call (tc's attention and merge kernels, flash's split and merge) counts for its point.
Flags: ``--cache-control all`` (caches flushed before every replay pass), ncu's own default
clock control, left as it is (it locks the clocks for its replay, so its durations are not the
timer's; the SM clock it ran at is recorded), kernel replay, an explicit metric list instead of
sections to keep the passes few.

Per call: ``duration_s`` the sum of its kernels' durations; ``dram_bytes_per_s`` their DRAM
bytes over that sum; ``dram_pct``, ``tensor_pipe_pct``, ``issue_pct``, ``occupancy_pct``,
``sm_clock_hz`` and each stall ratio the duration-weighted means of its kernels;
``registers`` and ``dynamic_smem_bytes`` the main kernel's (its longest), and ``sm_tail``, the SM
tail: its busiest SM's active cycles over the mean SM's (ncu's max and avg over the SMs of
sm__cycles_active). 1 is an even spread; 1.14 leaves the mean SM idle for the last 12% of the
busiest one's time (docs/tc.md: an ncu profile of Chain h8 q9 p65536 on an H100, before
0c5ad00, read tc 1.14 and FlashMLA 1.07). Hopper's warpgroup (gmma, wgmma) and
mma.sync (hmma) tensor pipes are separate metrics: the largest pipe is ``tensor_pipe_pct``,
which one is ``tensor_pipe``. A stall ratio is warps stalled for that reason per issue-active
cycle (ncu's WarpStateStats); ``top_stall`` is the largest.

Metrics. Each quantity has candidate names (METRICS, TENSOR_PIPES, STALLS); those that
``ncu --query-metrics`` lists for the device are asked for, the first present is used and
recorded in ``metrics``; a quantity with none has no series, said in one line, and so has one
ncu refuses all the same (the profile is then taken again without it) or leaves out of its
report.

Where the warps wait (``--source``, ``run_source``): a second form, not a series. The same
target under ncu's SourceCounters (a warp sample every 64 cycles a scheduler) and SpeedOfLight
(the launches' durations); each call's main kernel's source page is read by verify_attn.stalls:
its samples by kind (an mbarrier's try_wait loop, a named barrier, a warpgroup MMA's wait or
issue, the rest with its stall reasons) and its top source lines and instructions. Each page is
kept under the point's name (page_name), a run replacing the last run's, for `python -m
verify_attn stalls` to set a base's page beside a head's.

Cost, measured on the H200 (ncu 2025.3.1, 2026-12-02, before the SM tail's two metrics): 6
points x 3 kernels at ffa97079, 18 calls profiled in 17 s, 5 replay passes a launch, Profile's
whole set-up 24 s (effa37c, 4 kernels: 24 calls in 20-23 s); so every Quick point is profiled.
The result records the measured ``seconds`` and ncu's ``passes`` per launch.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

from . import grid, ncu, registry

RANGE = "verify_attn.profile"  # the NVTX range ncu's filter takes: only the profiled calls
LABEL = re.compile(r"va-profile:(\d+):(\d+):(\d+):([\w.@-]+)")  # impl, or impl@ns: another build's
# quantity -> candidate metric names, preferred first (Nsight Compute 2023-2025 names).
METRICS = {
    "duration": ("gpu__time_duration.sum",),
    "dram_bytes": ("dram__bytes.sum",),
    "dram_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "issue_pct": ("sm__inst_issued.avg.pct_of_peak_sustained_active",  # "Issue Slots Busy"
                  "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "sm_clock_hz": ("gpc__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second"),  # as ncu set it
    "registers": ("launch__registers_per_thread",),
    "dynamic_smem_bytes": ("launch__shared_mem_per_block_dynamic",),
    "sm_active_max": ("sm__cycles_active.max",),  # the busiest SM's cycles with a block resident
    "sm_active_avg": ("sm__cycles_active.avg",),
}
# Quantities that make one series between them (summarise): without either, that series goes.
PART_OF = {"sm_active_max": "sm_tail", "sm_active_avg": "sm_tail"}
# Every tensor pipe ncu offers is asked for; the busiest is the call's tensor_pipe_pct.
TENSOR_PIPES = {
    "gmma": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",  # wgmma, Hopper
    "hmma": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",  # mma.sync
    "tensor": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",         # all, where offered
}
# The main reasons of WarpStateStats, few: each is a series of 54 asv jobs. "gmma" is Hopper's
# wait on warpgroup MMAs; "selected" (the warp issuing) is no stall and not asked for.
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "wait", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "not_selected", "gmma", "no_instruction")


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


def candidates() -> dict[str, tuple[str, ...]]:
    """Every quantity's candidate names: METRICS, each tensor pipe, each stall."""
    out = dict(METRICS)
    out.update({f"pipe_{p}": (name,) for p, name in TENSOR_PIPES.items()})
    out.update({f"stall_{r}": (stall_metric(r),) for r in STALLS})
    return out


def choose(known: set[str] | None) -> tuple[dict[str, str], list[str]]:
    """({quantity: metric used}, [quantities ncu offers none of]) for the query's base names
    (None: the query failed, every quantity's first candidate)."""
    chosen, missing = {}, []
    for quantity, names in candidates().items():
        name = next((n for n in names if ncu.offered(n, known)), None)
        if name is None:
            missing.append(quantity)
        else:
            chosen[quantity] = name
    return chosen, missing


def impls() -> tuple[str, ...]:
    """The implementations profiled, in asv's display order: those Quick times with CUDA
    kernels (verify_attn.grid), not the baseline."""
    return tuple(n for n in grid.impls_of("quick", registry.display_order("cuda"))
                 if registry.get(n).cuda_sources and not registry.get(n).baseline)


def label(heads: int, q_len: int, prefix: int, impl: str) -> str:
    return f"va-profile:{heads}:{q_len}:{prefix}:{impl}"


def point_of(name: str) -> tuple | None:
    """(heads, q_len, prefix_len, impl) of a kernel renamed by its NVTX range, or None."""
    m = LABEL.search(name)
    return (int(m[1]), int(m[2]), int(m[3]), m[4]) if m else None


def attribute(plain: list[dict], renamed: list[dict]) -> tuple[dict[tuple, list[dict]], list[dict]]:
    """({point: its kernel launches in launch order}, [launches no range names]): the two
    exports of one report joined by launch ID; a launch keeps its real kernel name."""
    ranges = {r["id"]: point_of(r["kernel"]) for r in renamed}
    calls, stray = {}, []
    for launch in sorted(plain, key=lambda r: r["id"]):
        point = ranges.get(launch["id"])
        if point is None:
            stray.append(launch)
        else:
            calls.setdefault(point, []).append(launch)
    return calls, stray


def kernel_name(kernel: str) -> str:
    """A kernel's function name without its namespace, template arguments and parameters
    (verify_attn::<unnamed>::tc_attn<...Config<2, 4>>(...) -> tc_attn)."""
    name = kernel.split("(")[0].strip()
    while re.search(r"<[^<>]*>", name):  # innermost first: <unnamed> and nested arguments alike
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split()[-1].split("::")[-1] if name.split() else kernel


def summarise(launches: list[dict], chosen: dict[str, str]) -> dict:
    """One call's figures from its kernel launches (the rules in the module's docstring);
    NaN where a metric is not chosen or has no value."""
    def values(quantity):
        name = chosen.get(quantity)
        return [l["values"].get(name, math.nan) if name else math.nan for l in launches]

    durations = values("duration")
    total = sum(d for d in durations if not math.isnan(d))
    weights = durations if total > 0 else [1.0] * len(launches)
    wsum = sum(w for w in weights if not math.isnan(w))

    def weighted(quantity):
        pairs = [(v, w) for v, w in zip(values(quantity), weights) if not math.isnan(v) and not math.isnan(w)]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs and wsum > 0 else math.nan

    main = longest(durations)
    dram = [v for v in values("dram_bytes") if not math.isnan(v)]
    pipes = {p: weighted(f"pipe_{p}") for p in TENSOR_PIPES}
    pipes = {p: v for p, v in pipes.items() if not math.isnan(v)}
    stalls = {r: weighted(f"stall_{r}") for r in STALLS}
    ranked = [r for r in STALLS if not math.isnan(stalls[r])]
    busiest = max(pipes, key=pipes.get) if pipes else ""
    most, mean = values("sm_active_max")[main], values("sm_active_avg")[main]
    return {
        "kernels": [kernel_name(l["kernel"]) for l in launches],
        "duration_s": total if total > 0 else math.nan,
        "dram_bytes_per_s": sum(dram) / total if dram and total > 0 else math.nan,
        "dram_pct": weighted("dram_pct"),
        "tensor_pipe_pct": pipes[busiest] if busiest else math.nan,
        "tensor_pipe": busiest,
        "issue_pct": weighted("issue_pct"),
        "occupancy_pct": weighted("occupancy_pct"),
        "sm_clock_hz": weighted("sm_clock_hz"),
        "registers": values("registers")[main],
        "dynamic_smem_bytes": values("dynamic_smem_bytes")[main],
        "sm_tail": most / mean if mean > 0 else math.nan,  # NaN where either is missing
        "stalls": stalls,
        "top_stall": max(ranked, key=stalls.get) if ranked else "",
    }


def longest(durations: list[float]) -> int:
    """The index of a call's main kernel: its longest launch (a duration ncu left n/a counts as none)."""
    return max(range(len(durations)), key=lambda n: -1 if math.isnan(durations[n]) else durations[n])


def target_command(manifest: Path, variant: str, points: list[tuple], names, base: str | None = None) -> list[str]:
    """The command ncu profiles: this module as its --target at the points, for names (default
    impls()); with base (a commit), that commit's kernels of the same names beside them."""
    return [sys.executable, "-m", "verify_attn.profile", "--target", "--manifest", str(manifest),
            "--variant", variant, "--points", ",".join(":".join(map(str, p)) for p in points),
            "--impls", ",".join(names or impls()), *(("--base", base) if base else ())]


def manifest_of(manifest: Path) -> dict:
    """What the target called and skipped (nothing when it wrote no manifest)."""
    return json.loads(manifest.read_text()) if manifest.exists() else {"profiled": [], "skipped": {}}


def work_dir() -> Path:
    """Where the last profile's files stay for a person to open (report, exports, ncu's log)."""
    from . import build

    path = build.cache_dir() / "profile"
    path.mkdir(parents=True, exist_ok=True)
    return path


def say(line: str) -> None:
    from . import suite

    suite.progress(f"[verify_attn] profile: {line}")


def run(points=None, timeout: float = 200, builds=("extension",), variant: str = "quick", names=None) -> dict:
    """Profile the points of a variant's selection (default Quick; its points on this device
    unless given: (heads, q_len, prefix), or (batch, heads, q_len) for the serving variants) for
    names (default impls(); peers such as flashmla too) in one ncu process, once the extension
    is built (with it the other builds named, not waited for: verify_attn.prebuild). Raises
    ncu.NcuError (one line) when nothing can be recorded."""
    from . import prebuild, suite

    points = [tuple(p) for p in (points or suite.selection(variant).points())]
    tool = ncu.find()
    chosen, missing = choose(ncu.query_metrics(tool))
    for quantity in missing:
        say(f"ncu offers none of {', '.join(candidates()[quantity])} on this device: "
            f"no {PART_OF.get(quantity, quantity)} series")
    # The extension must be done before ncu starts, not built under it.
    for proc in prebuild.start(builds):
        if proc.args[-1] == "extension":
            proc.wait()
    t0 = time.perf_counter()  # the profile's own time, what the 30 s budget is about
    out = work_dir()
    report, manifest = out / "report", out / "manifest.json"
    manifest.unlink(missing_ok=True)
    command = target_command(manifest, variant, points, names)
    requested = sorted(set(chosen.values()))
    try:
        log = ncu.profile(tool, report, requested, f"{RANGE}/", command, timeout)
    except ncu.NcuError as exc:
        (out / "ncu.log").write_text(exc.log)
        unknown = ncu.refused(exc.log, requested)  # listed by the query (or not asked) yet refused
        if not unknown:
            raise
        say(f"ncu refused {', '.join(unknown)}: profiling again without")
        chosen = {q: n for q, n in chosen.items() if n not in unknown}
        missing += [q for q, n in candidates().items() if q not in chosen and q not in missing]
        requested = sorted(set(chosen.values()))
        log = ncu.profile(tool, report, requested, f"{RANGE}/", command, timeout)
    (out / "ncu.log").write_text(log)
    plain, renamed = ncu.export_raw(tool, report), ncu.export_raw(tool, report, nvtx_rename=True)
    (out / "raw.csv").write_text(plain)
    (out / "raw-nvtx.csv").write_text(renamed)
    launches = ncu.parse_raw(plain)
    columns = set().union(*(l["values"] for l in launches)) if launches else set()
    for quantity, name in list(chosen.items()):
        if name not in columns:
            say(f"ncu's report has no column {name}: no {PART_OF.get(quantity, quantity)} series")
            del chosen[quantity]
            missing.append(quantity)
    calls, stray = attribute(launches, ncu.parse_raw(renamed))
    if stray:
        say(f"{len(stray)} profiled launches outside any point's range, left out: "
            f"{', '.join(sorted({kernel_name(l['kernel']) for l in stray}))}")
    if not calls:
        raise ncu.NcuError(f"no profiled launch could be attributed to a point (see {out})")
    done = manifest_of(manifest)
    for name in done["profiled"]:
        if point_of(name) not in calls:
            say(f"{name} was called but no kernel of it was profiled")
    return {"device": "cuda", "variant": variant, "ncu": ncu.version(tool), "metrics": chosen,
            "missing": sorted(set(missing)),
            "points": {p: summarise(k, chosen) for p, k in calls.items()},
            "skipped": {point_of(k): why for k, why in done["skipped"].items()},
            "passes": ncu.passes(log), "seconds": time.perf_counter() - t0, "files": str(out)}


# Per-instruction warp samples: SourceCounters, and SpeedOfLight for the launches' durations
# (which kernel of a call is its main one); a sample every 2^(5+1) = 64 cycles a warp scheduler.
SOURCE_SECTIONS = ("SourceCounters", "SpeedOfLight")
SOURCE_OPTIONS = ("--warp-sampling-interval", "1")


def run_source(points=None, timeout: float = 300, variant: str = "quick", names=None, top: int = 10,
               base: str | None = None) -> dict:
    """Where the warps of each call's main kernel (its longest launch) wait, from ncu's
    per-instruction samples (verify_attn.stalls), for the points and implementations run()
    takes, in one ncu process; with base (a commit), also that commit's kernels of those names
    (impl@va_base, verify_attn.revision.BASE_NS: the base's page beside the head's, as `ab
    --source` sets them). Raises ncu.NcuError (one line) when nothing can be read."""
    from . import prebuild, stalls, suite

    points = [tuple(p) for p in (points or suite.selection(variant).points())]
    tool = ncu.find()
    for proc in prebuild.start(("extension",)):
        proc.wait()
    t0 = time.perf_counter()
    out = work_dir() / "source"
    out.mkdir(parents=True, exist_ok=True)
    report, manifest = out / "report", out / "manifest.json"
    manifest.unlink(missing_ok=True)
    for stale in out.glob("source-*.csv"):  # a page left from an earlier run would pass for this one's
        stale.unlink()
    command = target_command(manifest, variant, points, names, base)
    log = ncu.profile(tool, report, [], f"{RANGE}/", command, timeout, SOURCE_SECTIONS, SOURCE_OPTIONS)
    (out / "ncu.log").write_text(log)
    calls, _ = attribute(ncu.parse_raw(ncu.export_raw(tool, report)),
                         ncu.parse_raw(ncu.export_raw(tool, report, nvtx_rename=True)))
    if not calls:
        raise ncu.NcuError(f"no profiled launch could be attributed to a point (see {out})")
    duration = METRICS["duration"][0]
    kernels = {}
    for point, launches in calls.items():
        main = launches[longest([l["values"].get(duration, math.nan) for l in launches])]
        text = ncu.export_source(tool, report, main["id"])
        page = out / page_name(variant, point)
        page.write_text(text)
        try:
            _, instructions = stalls.parse(text)
        except stalls.SourcePageError as exc:
            raise ncu.NcuError(f"launch {main['id']} ({kernel_name(main['kernel'])}): {exc}") from None
        kernels[point] = {"kernel": kernel_name(main["kernel"]), "page": str(page), **stalls.summarise(instructions, top)}
    done = manifest_of(manifest)
    return {"variant": variant, "ncu": ncu.version(tool), "points": kernels,
            "skipped": {point_of(k): why for k, why in done["skipped"].items()},
            "seconds": time.perf_counter() - t0, "files": str(out)}


def page_name(variant: str, point: tuple) -> str:
    """The file of a point's source page: source-chain-h64-q9-p65536-tc.csv (what `python -m
    verify_attn stalls` takes, a base's page beside a head's)."""
    from . import suite

    return f"source-{variant}-{suite.point_name(variant, point[:3]).replace(' ', '-')}-{point[3]}.csv"


def recorded() -> dict:
    """What the asv class records: run()'s result, or {"error": one line} (no GPU, no ncu, a
    failed profile), never an exception: the suite's other results stand either way."""
    from . import prebuild, suite

    if suite.device() != "cuda":
        return {"error": "no GPU: the profiler's series are GPU only"}
    try:
        # Every build of the suite starts here, side by side: asv sets this class up before
        # Resources and the grids.
        result = run(builds=prebuild.WHAT)
    except Exception as exc:  # noqa: BLE001 - whatever stops the profile is one line, not asv's traceback
        line = str(exc).splitlines()[0] if str(exc) else ""
        why = line if isinstance(exc, ncu.NcuError) else f"{type(exc).__name__}: {line}"
        say(f"no series: {why}")
        return {"error": why}
    say(f"{len(result['points'])} calls profiled in {result['seconds']:.0f} s ({result['ncu']}; "
        f"passes a launch {min(result['passes'], default=0)}-{max(result['passes'], default=0)}; files {result['files']})")
    return result


def target(points: list[tuple], impls_: list[str], manifest: Path, variant: str = "quick", base: str | None = None) -> int:
    """The program ncu profiles: each candidate once at each point of the variant, in its
    point's NVTX range, after a check and a warm-up call outside it; with base (a commit),
    that commit's build of the same implementations too (revision.BASE_NS, built from git as
    `ab` builds it: cached, so ab's own build is found)."""
    import torch

    from . import anchor, build, candidate, cases, ops, revision, suite

    ops.load()
    chosen = candidate.of(impls_)
    if base:
        lib, held = revision.library(anchor.repository(), base, revision.BASE_NS)
        build.load_library(lib)
        chosen += candidate.of([i for i in impls_ if i in held], revision.BASE_NS)
    done = {"profiled": [], "skipped": {}}
    for point in points:
        inputs = cases.make_inputs(suite.case_of(variant, point), "cuda", 0)
        for o in candidate.outcomes(inputs, chosen):
            name = label(*point, o.candidate.name)
            if o.skipped or not o.error.ok:
                done["skipped"][name] = o.skipped or f"fails its check: {o.error.reason}"
                continue
            call = candidate.prepare(o.candidate, inputs)
            call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(RANGE)
            torch.cuda.nvtx.range_push(name)
            call()
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            done["profiled"].append(name)
        del inputs
        torch.cuda.empty_cache()  # what ncu saves and restores each pass: this point's memory only
    manifest.write_text(json.dumps(done))
    return 0


def table(result: dict) -> str:
    """The result as a table for a person."""
    from . import suite

    rows = [f"{'point':24s} {'kernels':28s} {'us':>8s} {'GB/s':>7s} {'dram%':>6s} {'tensor%':>8s} {'issue%':>7s} "
            f"{'occ%':>5s} {'regs':>5s} {'smem':>7s} {'tail':>5s}  top stall"]
    for (h, q, p, impl), c in sorted(result["points"].items(), key=lambda kv: (kv[0][:3], kv[0][3])):
        where = f"{suite.point_name(result.get('variant', 'quick'), (h, q, p))} {impl}"
        rows.append(f"{where:24s} {'+'.join(c['kernels'])[:28]:28s} {c['duration_s'] * 1e6:8.1f} "
                    f"{c['dram_bytes_per_s'] / 1e9:7.0f} {c['dram_pct']:6.1f} {c['tensor_pipe_pct']:5.1f} "
                    f"{c['tensor_pipe'][:2]:2s} {c['issue_pct']:7.1f} {c['occupancy_pct']:5.1f} {c['registers']:5.0f} "
                    f"{c['dynamic_smem_bytes']:7.0f} {c['sm_tail']:5.2f}  {c['top_stall']}")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m verify_attn.profile", description=__doc__.splitlines()[0])
    p.add_argument("--target", action="store_true", help="(ncu's target: run the calls, profile nothing)")
    p.add_argument("--manifest", type=Path, help="(with --target) where to write what was called and skipped")
    p.add_argument("--base", help="(with --target) a commit whose kernels of the same names run beside (ab --source)")
    p.add_argument("--variant", default="quick", choices=list(grid.SELECTIONS["cuda"]),
                   help="the selection whose cases are profiled (default quick; verify_attn.grid)")
    p.add_argument("--points", help="H:Q:P,... (B:H:Q for the serving variants; default: the variant's points "
                                    "on this device)")
    p.add_argument("--impls", help="the implementations, comma separated (default: the kernels under test "
                                   "that Quick times; a peer such as flashmla may be named)")
    p.add_argument("--source", action="store_true",
                   help="where the warps of each call's main kernel wait, from ncu's per-instruction samples "
                        "(verify_attn.stalls) instead of the counters")
    p.add_argument("--top", type=int, default=10, help="(with --source) source lines and instructions shown")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error(f"--top {args.top}: give a count of 1 or more")
    try:
        points = [tuple(int(x) for x in s.split(":")) for s in args.points.split(",")] if args.points else None
    except ValueError:
        p.error(f"--points {args.points!r}: give H:Q:P,... (B:H:Q for the serving variants), integers")
    if points and any(len(pt) != 3 for pt in points):
        p.error(f"--points {args.points!r}: three integers a point")
    names = args.impls.split(",") if args.impls else None
    unknown = sorted(set(names or ()) - set(registry.IMPLS))
    if unknown:
        p.error(f"--impls: {', '.join(unknown)} not in the registry ({', '.join(registry.IMPLS)})")
    if args.target:
        return target(points or [], names or [], args.manifest, args.variant, args.base)
    if args.source:
        return _main_source(points, args, names)
    try:
        result = run(points, variant=args.variant, names=names)
    except ncu.NcuError as exc:
        print(f"python -m verify_attn.profile: {exc}", file=sys.stderr)
        return 1
    print(table(result))
    print(f"{len(result['points'])} calls in {result['seconds']:.1f} s; {result['ncu']}; passes a launch "
          f"{sorted(set(result['passes']))}; metrics {json.dumps(result['metrics'])}; missing {result['missing']}; "
          f"skipped {result['skipped']}; files {result['files']}")
    if args.json:
        write_json(args.json, result)
    return 0


def write_json(path: Path, result: dict) -> None:
    """A result as JSON: its (point) keys as "H:Q:P:IMPL" strings."""
    path.write_text(json.dumps({**result, "points": {":".join(map(str, k)): v for k, v in result["points"].items()},
                                "skipped": {str(k): v for k, v in result["skipped"].items()}}, indent=1))


def _main_source(points, args, names) -> int:
    from . import stalls, suite

    try:
        result = run_source(points, variant=args.variant, names=names, top=args.top)
    except ncu.NcuError as exc:
        print(f"python -m verify_attn.profile --source: {exc}", file=sys.stderr)
        return 1
    for (h, q, p, impl), s in sorted(result["points"].items(), key=lambda kv: (kv[0][:3], kv[0][3])):
        print(stalls.table(f"{suite.point_name(args.variant, (h, q, p))} {impl} ({s['kernel']})", s))
        print(f"  page: {s['page']}\n")
    print(f"{len(result['points'])} kernels in {result['seconds']:.1f} s; {result['ncu']}; skipped "
          f"{result['skipped']}; files {result['files']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
