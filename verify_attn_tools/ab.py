"""Paired check: a base commit's kernels and the checkout's, timed in one process, in turn.

    python -m verify_attn ab [BASE] [-f 1.01] [--impl flash tc] [--pairs 20] [--points quick chain ..]
                             [--source chain:64:9:65536 ..] [--json FILE]

BASE (a git revision, default main) has its kernels/ built from git into its own op
namespace (va_base) beside the checkout's own build (the working tree as it is, committed or
not). At every Quick point of this device (verify_attn.grid) each kernel under test is
timed base and head in turn on the same inputs, half the pairs base first and half head
first, with the suite's timer. Why: between two processes the same kernel's time moves by
about 2% on the H200 and by 4-6% on a busy 2-core CPU, which `asv continuous` (one process
a commit) cannot tell from a change; the two samples of a pair share the process, the clock
and the load, and their ratio does not move with them.

Per kernel and point: the ratio is the median of the pairs' head/base time ratios; "slower"
when it is above the factor and at least the sign test's share of pairs is slower (two-sided,
p < 0.01: 17 of 20 pairs, 10 of 10), "faster" the other way round. Before timing, the
checkout's kernels must pass every named case (verify_attn.parity, the Quick gate), and
both sides each timed point, against the float64 reference. --points times other selections
of the grid instead of Quick's, or beside it (chain: batch 1 chain trees at prefix
2,048-65,536; serving and serving_chain: the ragged batches, where a plan change for batch > 1
shows and Quick's points do not), in the one process with one build and one gate: `--points
quick chain serving_chain` is the whole kernel picture in one call.
Exit 2 when the checkout fails a check (nothing is timed) or nothing could be timed (no kernel
runs on this device: one line says why), 1 when a kernel got slower, 0 otherwise; a markdown table on stdout (the job's log), --json for
the rows, which `python -m verify_attn report --ab FILE` makes the pull request's one verdict.

The base is built with this checkout's registry and binding generator (verify_attn.revision):
a kernel or path variant the base does not have is checked on the head's side and shown as
new, untimed (asv continuous compares any two commits). Every pinned-path variant of the
registry (tc_mma: tc's portable path) is a kernel here, in the gate and in the pairs, so a
break confined to one path fails the check on a GPU whose best path is another.
A change to the Python package alone (verify_attn/) is asv's to see: ab times both sides
through it. A kernel found slower on a GPU gets its sources compiled at both revisions
(verify_attn_tools.sass): its status says whether its machine code moved, or that the two
builds' launch plans differ at that point, since identical code under the same plan reading
slower is two loaded copies' levels (docs/timing.md); the verdict stays the pairs'.

Where kernels/ changed, the kernels' PTX for this GPU is read at both revisions for registers
some path reads before any write (verify_attn_tools.ptx_reads): a kernel that reads one at a
source line where the base's does not is listed under the table, a value C++ may leave unset
on a path that the named cases did not meet; the exit code stays the pairs'.

--source SEL:H:Q:P ... says where, after the pairs: the base's and the head's kernels (--impl's,
default tc) at those points under Nsight Compute's per-instruction warp samples, in one ncu
process a selection (verify_attn.profile.run_source, the base's build beside the checkout's),
each pair of pages set side by side as `python -m verify_attn stalls` sets them (and under
"source" in --json). It needs a GPU and ncu; what cannot be profiled is one line, and the exit
code stays the pairs'.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

from verify_attn import build, cases, machine, ops, parity, registry, revision, suite
from verify_attn.candidate import Candidate, check, of, plan, prepare, reference_of
from verify_attn.measure import input_sets

from . import ROOT
from .cli import Refusal, parser
from .children import cleanup
from .sanitize import cell

NS = revision.BASE_NS  # the base's op namespace: torch.ops.va_base.<impl>
ALPHA = 0.01
SLOW_CALL_S = 0.02  # a kernel call longer than this gets at most 10 pairs (naive at 64K: 0.14 s)
POINTS = ("quick", "chain", "serving", "serving_chain")  # the selections of verify_attn.grid ab can time


def git(*args: str) -> str:
    try:
        return revision.git(ROOT, *args)
    except revision.RevisionError as exc:
        raise Refusal(str(exc)) from None


def sign_p(k: int, n: int) -> float:
    """Two-sided exact sign test: the chance of a split at least as uneven as k of n."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, j) for j in range(max(k, n - k), n + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclasses.dataclass
class Row:
    point: str                     # "h64 q9 p2048"
    impl: str
    status: str                    # slower, faster, same, failed (the checkout), base failed, new (not in the base)
    base_s: float | None = None    # medians of the samples
    head_s: float | None = None
    ratio: float | None = None     # median of the pairs' head/base ratios
    slower: int = 0                # pairs where head took longer
    pairs: int = 0
    p: float | None = None         # sign test
    reason: str = ""
    iqr: tuple | None = None       # (first, third) quartile of the pairs' head/base ratios: the spread
    clock_mhz: float | None = None # median SM clock over the pairs' samples (None: not read, a CPU)
    selection: str = "quick"       # the grid's selection the point belongs to (--points)
    code: str = ""                 # a slower kernel in both builds: identical or moved machine code, or
                                   # plan (its launch plan differs here); "": not compared
    plan_moved: bool = False       # the two builds' launch plans differ at this point (another path, split, tile)


def judge(base: list[float], head: list[float], factor: float, alpha: float = ALPHA) -> tuple[str, float, int, float]:
    """(status, median ratio, slower pairs, p) of paired samples."""
    ratios = [h / b for b, h in zip(base, head)]
    ratio = statistics.median(ratios)
    slower = sum(r > 1 for r in ratios)
    p = sign_p(slower, len(ratios))
    if p < alpha and ratio > factor and slower > len(ratios) / 2:
        return "slower", ratio, slower, p
    if p < alpha and ratio < 1 / factor and slower < len(ratios) / 2:
        return "faster", ratio, slower, p
    return "same", ratio, slower, p


def quartiles(values: list[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def compare_point(case: cases.Case, point: str, impls: list[str], timer, factor: float, pairs: int,
                  seed: int) -> list[Row]:
    """Check both sides at one point, then time each kernel's pairs (timer: the suite's,
    one for the run, so its clock screening sees every sample)."""
    sets = input_sets(case, timer.device, seed)
    first = sets[0]
    runnable = [c for c in of(impls) if not c.skip_reason(first)]
    if not runnable:
        return []
    ref = reference_of(first)
    rows = []
    for head in runnable:
        base = Candidate(head.impl, NS)
        head_err = check(head, first, ref)
        if not head_err.ok:
            rows.append(Row(point, head.impl, "failed", reason=head_err.reason))
            continue
        why = base.skip_reason(first)  # the base predates this kernel (or path variant)
        base_err = None if why else check(base, first, ref)
        if base_err is None or not base_err.ok:
            rows.append(Row(point, head.impl, "new" if why else "base failed", reason=why or base_err.reason))
            continue
        base_calls = [prepare(base, s) for s in sets]
        head_calls = [prepare(head, s) for s in sets]
        # A call timed after the check has run it: the check's own call carries one-time costs
        # (flash's 1.4 ms CPU call read over SLOW_CALL_S there), which would cut its pairs to 10.
        timer.samples = (min(pairs, 10) if timer.call_s(head_calls[0]) > SLOW_CALL_S else pairs) // 2
        # A sample dropped for a low SM clock is retaken after the other's: that pair is a
        # sample apart, which moves nothing the sign test relies on.
        one = timer.time_many({"base": base_calls, "head": head_calls})
        two = timer.time_many({"head": head_calls, "base": base_calls})
        b = one["base"].samples + two["base"].samples
        h = one["head"].samples + two["head"].samples
        status, ratio, slower, p = judge(b, h, factor)
        clocks = [t.sm_clock_mhz for t in (*one.values(), *two.values()) if t.sm_clock_mhz]
        rows.append(Row(point, head.impl, status, statistics.median(b), statistics.median(h), ratio, slower, len(b), p,
                        iqr=quartiles([y / x for x, y in zip(b, h)]),
                        clock_mhz=statistics.median(clocks) if clocks else None,
                        plan_moved=plan(base, first) != plan(head, first)))
    del ref
    return rows


def markdown(rows: list[Row], base: str, head: str, device: str, factor: float, failed: list[str],
             points: tuple[str, ...] = ("quick",)) -> str:
    """The check's own table (its log; the pull request's comment is report's, from --json): the
    wording and columns of report's."""
    from .report import AB_CLASS, CODE_WORDS, IDENTICAL_NOTE, change_words

    several = len(points) > 1

    def where(r: Row) -> str:  # the point, named with its selection's class where several were timed
        return f"{AB_CLASS.get(r.selection, r.selection)} {r.point}" if several else r.point

    slower = [r for r in rows if r.status == "slower"]
    faster = [r for r in rows if r.status == "faster"]
    if failed or any(r.status == "failed" for r in rows):
        verdict = "failed"
    elif slower:
        worst = max(slower, key=lambda r: r.ratio)
        verdict = f"slower ({len(slower)} slower, worst {worst.impl} at {where(worst)} {change_words(worst.ratio)})"
    elif faster:
        best = min(faster, key=lambda r: r.ratio)
        verdict = f"faster ({len(faster)} faster, best {best.impl} at {where(best)} {change_words(best.ratio)})"
    else:
        verdict = "no change"
    at = "" if points == ("quick",) else f" ({', '.join(points)} points)"
    lines = [f"**verify-attn ab {base} -> {head} on {device}{at}: {verdict}**", "",
             f"Paired in one process (base and head in turn, same inputs); change = median of the pairs' "
             f"head/base time; slower/faster beyond {factor:g} with the sign test at p < {ALPHA:g}; spread = the "
             f"interquartile range of the pairs' ratios over their median.", ""]
    if failed:
        lines += ["Nothing timed: the checkout fails named cases:", *(f"- {cell(f)}" for f in failed), ""]
    order = {"failed": 0, "slower": 1, "base failed": 2, "new": 3, "faster": 4, "same": 5}
    lines += ["| point | impl | base | head | change | spread | slower pairs | p | status |",
              "|---|---|---:|---:|---|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (order[r.status], where(r), r.impl)):
        if r.ratio is None:
            lines.append(f"| {cell(where(r))} | {cell(r.impl)} | | | | | | | {r.status}: {cell(r.reason)} |")
            continue
        spread = f"{100 * (r.iqr[1] - r.iqr[0]) / r.ratio:.1f}%" if r.iqr else "-"
        lines.append(f"| {cell(where(r))} | {cell(r.impl)} | {r.base_s * 1e3:.4f} ms | {r.head_s * 1e3:.4f} ms | "
                     f"{change_words(r.ratio)} | {spread} | {r.slower}/{r.pairs} | {r.p:.2g} | "
                     f"{'ok' if r.status == 'same' else r.status}{CODE_WORDS.get(r.code, '')} |")
    if any(r.code == "identical" for r in rows):
        lines += ["", IDENTICAL_NOTE]
    return "\n".join(lines)


def machine_code(rows: list[Row], base_sha: str, arch: str | None) -> None:
    """Sets each slower GPU kernel's code: "plan" where the two builds' launch plans differ at its
    point (the host code chose another path, split or tile: the kernel that ran is not the same),
    else whether its sources compile to the same machine code for arch (nvcc's -arch; None: a
    CPU run, nothing compared) at the base and here (verify_attn_tools.sass, nvcc alone).
    Identical code under the same plan that reads slower is the two loaded copies' levels
    (docs/timing.md), which the table then says; the verdict stays the pairs'. Not compared
    (one line says why) where nvcc cannot."""
    slower = [r for r in rows if r.status == "slower" and registry.get(r.impl).cuda_sources]
    if not slower or arch is None:
        return
    for r in slower:
        r.code = "plan" if r.plan_moved else ""
    slower = [r for r in slower if not r.plan_moved]
    if not slower:
        return
    from . import sass

    sources = sorted({s for r in slower for s in registry.get(r.impl).cuda_sources})
    try:
        moved = sass.moved_sources(base_sha, sources, arch)
    except (Refusal, RuntimeError, OSError) as exc:
        print(f"python -m verify_attn ab: machine code not compared: {exc}", file=sys.stderr)
        return
    for r in slower:
        r.code = "moved" if any(moved[s] for s in registry.get(r.impl).cuda_sources) else "identical"


def unset_reads(base_sha: str, capability: tuple[int, int]) -> dict:
    """Where kernels/ changed: the checkout's kernels that read registers before writing them
    at source lines where the base's do not, in the PTX for this GPU (verify_attn_tools.
    ptx_reads): a value C++ left unset that the named cases may not have met. {"arch",
    "status": "kernels unchanged", "compared" or "not compared: <why>", "kernels": [{"source",
    "kernel", "reads": [{"register", "ptx", "where", "source"}, ...]}]}. It does not change the
    exit code: the compiler also reads such registers where no value depends on them."""
    from verify_attn import resources

    from . import ptx_reads, sass

    nvcc_arch = sass.arch_of(capability)
    out = {"arch": nvcc_arch, "status": "compared", "kernels": []}
    arch = next((a for a in resources.ARCHS if resources.BUILT_AS.get(a, a) == nvcc_arch), None)
    try:
        if not git("diff", "--name-only", base_sha, "--", "kernels").strip():
            return out | {"status": "kernels unchanged"}
        if arch is None:
            return out | {"status": f"not compared: {nvcc_arch} is not an architecture of the resource report"}
        new = ptx_reads.more(*ptx_reads.both(base_sha, None, (arch,)))
    except (Refusal, RuntimeError, OSError) as exc:
        print(f"python -m verify_attn ab: registers read before a write not compared: {exc}", file=sys.stderr)
        return out | {"status": f"not compared: {exc}"}
    out["kernels"] = [{"source": source, "kernel": kernel, "reads": [dataclasses.asdict(r) for r in reads]}
                      for (_, source, kernel), reads in sorted(new.items())]
    return out


def unset_lines(unset: dict) -> list[str]:
    """unset_reads for the report, under the table."""
    if unset["status"] == "kernels unchanged":
        return []
    head = f"Registers read before a write ({unset['arch']}, PTX)"
    if unset["status"] != "compared":
        return [f"\n{head}: {unset['status']}"]
    if not unset["kernels"]:
        return [f"\n{head}: no kernel reads one at a place the base's does not."]
    return ([f"\n**{head}: kernels that read one at a new place: {len(unset['kernels'])}** "
             "(`python -m verify_attn ptx-reads`): a value left unset on some path?"] +
            [f"- {k['source']} `{k['kernel']}`: {len(k['reads'])}, e.g. `{r['register']}` at {r['where']} "
             f"`{r['source']}`" for k in unset["kernels"] for r in k["reads"][:1]])


def main(argv=None) -> int:
    p = parser("ab", __doc__)
    p.add_argument("base", nargs="?", default="main", help="the git revision to compare with (default main)")
    p.add_argument("-f", "--factor", type=float, default=1.01,
                   help="a ratio beyond this (and significant) is a change (default 1.01)")
    p.add_argument("--impl", nargs="+", action="extend", choices=registry.names(),
                   help="default: the compiled kernels under test")
    p.add_argument("--pairs", type=int, default=20, help="pairs a kernel and point, even (default 20; 10 for calls over 20 ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--points", nargs="+", default=["quick"], choices=POINTS,
                   help="the grid's selections to time, in this order (default quick; the gate is Quick's either way)")
    p.add_argument("--source", nargs="+", default=[], type=source_point, metavar="SEL:H:Q:P",
                   help="after the pairs, where the warps of the base's and the head's kernels wait at these points "
                        "(e.g. chain:64:9:65536; serving ones SEL:B:H:Q), side by side (ncu; --impl's kernels, default tc)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.pairs < 10 or args.pairs % 2:
        p.error(f"--pairs must be an even number >= 10 (the sign test needs 10 for p < {ALPHA}), got {args.pairs}")
    if args.factor < 1:
        p.error(f"--factor must be >= 1, got {args.factor}")
    try:
        # An interrupt (Ctrl-C, SIGTERM) ends what the builds started below this process (ninja, nvcc).
        with cleanup():
            return run(args)
    except Exception as exc:  # a build or git failure is a failed check (2), never "slower" (1)
        if not isinstance(exc, Refusal):
            traceback.print_exc()
        print(f"python -m verify_attn ab: {exc}", file=sys.stderr)
        return 2


def source_point(text: str) -> tuple[str, tuple[int, int, int]]:
    """An argparse type: SEL:H:Q:P (SEL:B:H:Q for the serving selections) -> (SEL, the point)."""
    import argparse

    sel, _, rest = text.partition(":")
    try:
        point = tuple(int(x) for x in rest.split(":"))
    except ValueError:
        point = ()
    if sel not in POINTS or len(point) != 3:
        raise argparse.ArgumentTypeError(f"{text!r}: give SEL:H:Q:P (SEL:B:H:Q for the serving ones), SEL one of "
                                         f"{', '.join(POINTS)}, three integers")
    return sel, point


def source_pages(args, base_sha: str) -> list[dict]:
    """--source: the base's and the head's kernels profiled at the points in one ncu process a
    selection (verify_attn.profile.run_source with base, every source line kept), each pair set
    side by side as `python -m verify_attn stalls` sets two pages, printed. What ncu cannot do
    is one line on stderr: the pairs' verdict stands either way."""
    from verify_attn import ncu, profile

    from . import stalls

    impls = args.impl or ["tc"]
    out = []
    for sel in dict.fromkeys(s for s, _ in args.source):
        points = list(dict.fromkeys(pt for s, pt in args.source if s == sel))
        try:
            result = profile.run_source(points, variant=sel, names=impls, top=stalls.ALL, base=base_sha)
        except ncu.NcuError as exc:
            print(f"python -m verify_attn ab --source: {exc}", file=sys.stderr)
            continue
        for pt in points:
            for impl in impls:
                head, base = result["points"].get((*pt, impl)), result["points"].get((*pt, f"{impl}@{NS}"))
                where = f"{sel} {suite.point_name(sel, pt)} {impl}"
                if head is None or base is None:
                    why = {k: v for k, v in result["skipped"].items() if k[:3] == pt and k[3].split("@")[0] == impl}
                    print(f"\n{where}: not profiled on both sides ({why or 'no launch attributed'})")
                    continue
                c = stalls.compare(base, head, 12)
                pages = (Path(base["page"]).name, Path(head["page"]).name)
                print(f"\n{where}, base -> head:\n" + stalls.text((base["kernel"], head["kernel"]), pages, c))
                out.append({"selection": sel, "point": list(pt), "impl": impl, "base_page": base["page"],
                            "head_page": head["page"], **c})
    return out


def selected(points: str) -> list[tuple[cases.Case, str]]:
    """(case, point's name) of one selection of this device's grid, as the suite builds them."""
    return [(suite.case_of(points, pt), suite.point_name(points, pt)) for pt in suite.selection(points).points()]


def run(args) -> int:
    base_sha = git("rev-parse", "--verify", f"{args.base}^{{commit}}").strip()
    head_sha = git("rev-parse", "HEAD").strip()
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "kernels", "verify_attn").strip())
    head = f"{head_sha[:8]}{' + working tree' if dirty else ''}"
    dev = suite.device()
    selections = list(dict.fromkeys(args.points))  # each once, in the order given
    chosen = {}  # selection -> (kernels to time, (case, point) list)
    for sel in selections:
        impls = [i for i in (args.impl or suite.impls(sel)) if registry.get(i).compiled and
                 (args.impl or registry.get(i).under_test)]
        if not impls:
            raise Refusal("--impl: ab compares compiled kernels, and none was chosen")
        points = selected(sel)
        if not points:
            raise Refusal(f"--points {sel}: this device's grid ({dev}) has no such points (verify_attn.grid)")
        chosen[sel] = (impls, points)
    impls = list(dict.fromkeys(i for sel in selections for i in chosen[sel][0]))
    t0 = time.perf_counter()
    ops.load()
    # Nothing to time is a refusal (exit 2), never an empty table read as "no change".
    why = {i: ops.unsupported(i, dev) for i in impls}
    if all(why.values()):
        raise Refusal(f"nothing to time on {dev}: " + "; ".join(f"{i}: {r}" for i, r in why.items()))
    try:
        lib, _ = revision.library(ROOT, base_sha, NS)
    except revision.RevisionError as exc:
        raise Refusal(str(exc)) from None
    build.load_library(lib)
    built = time.perf_counter() - t0
    # The gate checks what Quick's gate checks (pinned paths Quick does not time included);
    # only the timed ones are paired.
    gated = [i for i in (args.impl or suite.gated()) if registry.get(i).compiled]
    failed = parity.failures(parity.gate(dev, of(gated)))
    rows = []
    if not failed:
        for sel in selections:
            sel_impls, points = chosen[sel]
            timer = suite.timer(sample_s=10e-3) if sel.startswith("serving") else suite.timer()
            for case, point in points:
                for r in compare_point(case, point, sel_impls, timer, args.factor, args.pairs, args.seed):
                    rows.append(dataclasses.replace(r, selection=sel))
    unset = None
    if dev == "cuda":
        import torch

        from .sass import arch_of

        machine_code(rows, base_sha, arch_of(torch.cuda.get_device_capability()))
        unset = unset_reads(base_sha, torch.cuda.get_device_capability())
    # The card by name: the lent machine may be an H100 or an H200, and a ratio is only read against its own card.
    card = machine.device_name(dev)
    text = markdown(rows, base_sha[:8], head, card, args.factor, failed, tuple(selections))
    print(text)
    for line in unset_lines(unset) if unset else []:
        print(line)
    print(f"\n(builds {built:.0f} s, checks and timing {time.perf_counter() - t0 - built:.0f} s)")
    sources = []
    if args.source and dev != "cuda":
        print("python -m verify_attn ab --source: profiling needs a CUDA GPU and ncu; not profiled", file=sys.stderr)
    elif args.source and failed:
        print("python -m verify_attn ab --source: not profiled: the checkout failed its check", file=sys.stderr)
    elif args.source:
        sources = source_pages(args, base_sha)
    code = 2 if failed or any(r.status == "failed" for r in rows) else 1 if any(r.status == "slower" for r in rows) else 0
    if not failed and not any(r.ratio is not None for r in rows):
        print(f"python -m verify_attn ab: nothing was timed on {dev} (no {', '.join(selections)} point ran a kernel of both "
              f"sides: {', '.join(impls)})", file=sys.stderr)
        code = 2
    if args.json:
        args.json.write_text(json.dumps({"base": base_sha, "head": head, "device": dev,
                                         "gpu": card if dev == "cuda" else None, "factor": args.factor,
                                         "alpha": ALPHA, "exit": code, "failed": failed,
                                         "points": selections, "source": sources, "unset_reads": unset,
                                         "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))
    return code
