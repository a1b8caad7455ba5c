"""A pull request's verdict as a markdown table (or JSON), from recorded asv results.

Compares commit B against A on one machine, re-running nothing. A change counts when the
ratio after/before passes the factor and asv's own test says the recorded samples differ
(Mann-Whitney, p < 0.002: the rule of `asv compare` and `asv continuous`). The verdict
comes first; then one row per case and implementation: time before -> after, the ratio,
whether it counts, speedup over naive and fraction of peak before -> after, and the
correctness status. A peer's speed (torch, FlashMLA: not under test) is shown but does not
decide the verdict. Failures and regressions first; unchanged rows are folded (dropped with
--only-changed). The named cases that fail the gate before Quick's timings (QuickCases) in B
and did not in A are listed by name. Exit codes as `asv continuous`: 2 when something failed
in B that did not fail in A, 1 when something got slower, 0 otherwise.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import ROOT
from .cli import Refusal, parser

BENCH = "bench_verify_attn"
# Parameter names to short labels, in the order the asv classes declare them.
LABEL = {"batch": "b", "heads": "h", "q_len": "q", "prefix_len": "p"}


@dataclass
class Row:
    case: str
    impl: str
    before: float | None       # seconds; None: failed, NaN: not measured
    after: float | None
    ratio: float | None        # after / before
    change: str                # "slower", "faster", "same", "failed", "fixed", "new", "gone"
    significant: bool
    speedup: tuple             # over naive, (before, after)
    peak: tuple                # fraction of peak, (before, after)

    @property
    def order(self) -> int:
        return ["failed", "slower", "faster", "fixed", "new", "gone", "same"].index(self.change)


def git_hash(rev: str) -> str:
    proc = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise Refusal(f"{rev!r} is not a commit of this repository")
    return proc.stdout.strip()


def machines_with(results_dir: Path, *hashes: str) -> list[str]:
    found = []
    for machine in sorted(p.parent.name for p in results_dir.glob("*/machine.json")):
        names = {p.name[:8] for p in (results_dir / machine).glob("*.json")}
        if all(h[:8] in names for h in hashes):
            found.append(machine)
    return found


def load(results_dir: Path, machine: str, commit: str):
    from asv import results as asv_results

    found = list(asv_results.iter_results_for_machine_and_hash(str(results_dir), machine, commit))
    if not found:
        raise Refusal(f"no results of {commit[:8]} on {machine} under {results_dir}")
    return found[0]


def points(res, key: str) -> dict:
    """{params tuple of literal values: (value, stats, samples)} of one benchmark."""
    import ast
    import itertools

    if key not in res.get_all_result_keys():
        return {}
    params = res.get_result_params(key)
    values = res.get_result_value(key, params)
    stats = res.get_result_stats(key, params)
    samples = res.get_result_samples(key, params)
    combos = itertools.product(*[[ast.literal_eval(v) for v in p] for p in params])
    return {combo: (v, st, sa) for combo, v, st, sa in zip(combos, values, stats, samples)}


def param_names(key: str, benchmarks: dict, count: int) -> list[str]:
    """The benchmark's parameter names: as asv recorded them (benchmarks.json), else as
    today's class declares them, else the last one taken for the implementation."""
    names = benchmarks.get(key, {}).get("param_names")
    if not names:
        try:
            import importlib

            module = importlib.import_module("benchmarks.bench_verify_attn")
            names = list(getattr(module, key.split(".")[1]).param_names)
        except (ImportError, AttributeError):
            names = []
    if len(names) > count and names[-1] == "impl":
        names = names[-count:]  # an older layout of the class: a leading axis added since (Quick's heads)
    if len(names) != count:
        names = [f"p{k}" for k in range(count - 1)] + ["impl"]
    return names


def label(cls: str, names: list[str], combo: tuple) -> tuple[str, str]:
    """("Quick h64 q9 p65536", "tc") from a parameter tuple."""
    parts, impl = [], ""
    for name, value in zip(names, combo):
        if name == "impl":
            impl = value
        else:
            parts.append(f"{LABEL.get(name, name)}{value}")
    heads = re.fullmatch(r"Heads(\d+)", cls)
    if heads:
        parts.insert(0, f"h{heads[1]}")
    return f"{cls} {' '.join(parts)}".strip(), impl


def isna(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def compare(a_res, b_res, benchmarks: dict, factor: float, bench: str) -> list[Row]:
    from asv.commands.compare import _is_result_better

    rows = []
    keys = sorted(k for k in set(a_res.get_all_result_keys()) | set(b_res.get_all_result_keys())
                  if k.startswith(f"{BENCH}.") and k.endswith(".track_time") and re.search(bench, k))
    for key in keys:
        cls = key.split(".")[1]
        a, b = points(a_res, key), points(b_res, key)
        extra = {}
        for metric in ("track_time_vs_naive", "track_time_vs_roofline"):
            mk = key[: -len("track_time")] + metric
            extra[metric] = (points(a_res, mk), points(b_res, mk))
        for combo in sorted(set(a) | set(b), key=str):
            va, sa_stats, sa = a.get(combo, (float("nan"), None, None))
            vb, sb_stats, sb = b.get(combo, (float("nan"), None, None))
            if isna(va) and isna(vb) and not (va is None or vb is None):
                continue  # measured in neither: not this device's grid, or skipped both times
            case, impl = label(cls, param_names(key, benchmarks, len(combo)), combo)
            ratio = vb / va if not isna(va) and not isna(vb) and va > 0 else None
            significant = False
            if vb is None and va is not None:
                change = "failed"
            elif va is None and vb is not None:
                change = "fixed" if not isna(vb) else "same"
            elif va is None and vb is None:
                change = "failed"
            elif isna(va):
                change = "new"
            elif isna(vb):
                change = "gone"
            elif _is_result_better(va, vb, (sa_stats, sa), (sb_stats, sb), factor):
                change, significant = "slower", True
            elif _is_result_better(vb, va, (sb_stats, sb), (sa_stats, sa), factor):
                change, significant = "faster", True
            else:
                change = "same"

            def inverse(metric):
                pa, pb = extra[metric]
                xa, xb = pa.get(combo, (None,))[0], pb.get(combo, (None,))[0]
                return (None if isna(xa) or not xa else 1 / xa, None if isna(xb) or not xb else 1 / xb)

            rows.append(Row(case, impl, va, vb, ratio, change, significant, inverse("track_time_vs_naive"),
                            inverse("track_time_vs_roofline")))
    return sorted(rows, key=lambda r: (r.order, -(r.ratio or 0) if r.change == "slower" else (r.ratio or 0),
                                       r.case, r.impl))


def failed_cases(a_res, b_res) -> list[str]:
    """"impl on case" for each named case of the Quick gate that fails in B and did not in A."""
    key = f"{BENCH}.QuickCases.track_error"
    a, b = points(a_res, key), points(b_res, key)
    return [f"{impl} on {case}" for (case, impl), (v, _, _) in sorted(b.items())
            if v is None and a.get((case, impl), (0,))[0] is not None]


def fmt_time(v) -> str:
    if v is None:
        return "failed"
    if isna(v):
        return "-"
    return f"{v * 1e3:.4g} ms"


def fmt_pair(pair, kind: str) -> str:
    a, b = pair
    show = (lambda x: f"{x:.3g}x") if kind == "x" else (lambda x: f"{100 * x:.3g}%")
    if a is None and b is None:
        return "-"
    return f"{show(a) if a is not None else '-'} → {show(b) if b is not None else '-'}"


STATUS = {"failed": "**FAILED**", "slower": "slower", "faster": "faster", "fixed": "fixed", "new": "new",
          "gone": "not run", "same": "ok"}


def counts(impl: str) -> bool:
    """Whether impl's speed decides the verdict: a kernel under test (or one no longer registered)."""
    from verify_attn import registry

    entry = registry.IMPLS.get(impl)
    return entry is None or entry.under_test


def markdown(rows: list[Row], a: str, b: str, machine: str, factor: float, only_changed: bool,
             cases: list[str] = ()) -> tuple[str, int]:
    failed = [r for r in rows if r.change == "failed"]
    # A peer's speed (torch, FlashMLA) is shown but is not the pull request's verdict.
    slower = [r for r in rows if r.change == "slower" and counts(r.impl)]
    faster = [r for r in rows if r.change == "faster" and counts(r.impl)]
    code = 2 if failed or cases else 1 if slower else 0
    verdict = "failed" if code == 2 else "slower" if slower else "faster" if faster else "no significant change"
    worst = max((r.ratio for r in slower), default=None)
    best = min((r.ratio for r in faster), default=None)
    detail = ", ".join(filter(None, [
        f"{len(cases)} named case{'s' if len(cases) > 1 else ''} failed" if cases else "",
        f"{len(failed)} failed" if failed else "",
        f"{len(slower)} slower (worst x{worst:.3f})" if slower else "",
        f"{len(faster)} faster (best x{best:.3f})" if faster else ""])) or "within the rule"
    lines = [f"### verify-attn {a[:8]} → {b[:8]} on {machine}: **{verdict}** ({detail}, {len(rows)} points)", "",
             f"A change counts when after/before passes {factor} (or 1/{factor}) and asv's Mann-Whitney test on "
             "the recorded samples says they differ (p < 0.002). Time is the median per call; speedup over "
             "naive and % of peak from the same runs.", ""]
    if cases:
        lines += [f"Named cases failing at {b[:8]}, so nothing of Quick was timed (tolerances: "
                  f"verify_attn/accuracy.py): {', '.join(cases)}.", ""]
    head = "| case | impl | before | after | ratio | counts | x naive | % of peak | status |"
    sep = "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"

    def line(r: Row) -> str:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        return (f"| {r.case} | {r.impl} | {fmt_time(r.before)} | {fmt_time(r.after)} | {ratio} | "
                f"{'yes' if r.significant else 'no'} | {fmt_pair(r.speedup, 'x')} | {fmt_pair(r.peak, '%')} | "
                f"{STATUS[r.change]}{'' if counts(r.impl) or not r.significant else ' (a peer: not counted)'} |")

    changed = [r for r in rows if r.change not in ("same", "new", "gone")]
    same = [r for r in rows if r.change == "same"]
    if changed:
        lines += [head, sep, *map(line, changed)]
    for kind, what in (("new", f"Measured in {b[:8]} only"), ("gone", f"Measured in {a[:8]} only (not run after)")):
        by_impl: dict[str, int] = {}
        for r in rows:
            if r.change == kind:
                by_impl[r.impl] = by_impl.get(r.impl, 0) + 1
        if by_impl:
            lines += ["", f"{what}: " + ", ".join(f"{impl} at {n} points" for impl, n in sorted(by_impl.items())) + "."]
    if same and not only_changed:
        lines += ["", f"<details><summary>{len(same)} unchanged</summary>", "", head, sep, *map(line, same), "",
                  "</details>"]
    elif same:
        lines += ["", f"{len(same)} unchanged points not shown (--only-changed)."]
    return "\n".join(lines) + "\n", code


def main(argv=None) -> int:
    p = parser("report", __doc__)
    p.add_argument("before", help="the base commit (a hash, a branch, HEAD~1)")
    p.add_argument("after", help="the commit under review")
    p.add_argument("--machine", help="asv machine under results/ (default: the one that has both commits; "
                                     "with several, this box's, else the first)")
    p.add_argument("--factor", type=float, default=1.03, help="the change a ratio must pass (default 1.03)")
    p.add_argument("-b", "--bench", default="", help="only benchmarks matching this regex (e.g. Quick)")
    p.add_argument("--only-changed", action="store_true", help="drop the unchanged rows instead of folding them")
    p.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    p.add_argument("--results", type=Path, default=ROOT / "results", help="asv results directory")
    args = p.parse_args(argv)
    try:
        import asv  # noqa: F401
    except ImportError:
        raise Refusal(f"asv is not installed for {sys.executable}: run `bash test.sh` or `bash bench.sh` "
                      "first, which set it up") from None
    a, b = git_hash(args.before), git_hash(args.after)
    machine = args.machine
    if machine is None:
        candidates = machines_with(args.results, a, b)
        if not candidates:
            raise Refusal(f"no machine under {args.results} has results for both {a[:8]} and {b[:8]}")
        from verify_attn import suite
        from verify_attn.machine import asv_machine_name

        here = asv_machine_name(suite.device())
        machine = here if here in candidates else candidates[0]
    a_res, b_res = load(args.results, machine, a), load(args.results, machine, b)
    bench_file = args.results / "benchmarks.json"
    benchmarks = json.loads(bench_file.read_text()) if bench_file.exists() else {}
    rows = compare(a_res, b_res, benchmarks, args.factor, args.bench)
    cases = failed_cases(a_res, b_res) if re.search(args.bench, f"{BENCH}.QuickCases.track_error") else []
    text, code = markdown(rows, a, b, machine, args.factor, args.only_changed, cases)
    if args.json:
        print(json.dumps({"before": a, "after": b, "machine": machine, "factor": args.factor, "exit": code,
                          "failed_cases": cases, "rows": [asdict(r) | {"case": r.case} for r in rows]}, indent=1))
    else:
        print(text, end="")
    return code
