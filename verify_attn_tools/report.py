"""A pull request's verdict as a markdown table (or JSON), from recorded asv results.

Compares commit B against A on one machine, re-running nothing. The verdict is judged on the
drift-free series, track_time_vs_anchor: each sample is an implementation's time over the time
of a frozen anchor build of the kernels, the two timed alternately in the same process, so what
moves between processes and machine starts (raw times, 7-13% between starts of a lent H200)
divides out. A point counts when median(B's samples) / median(A's) passes the factor and asv's
own test says the samples differ (Mann-Whitney, p < 0.002: the rule of `asv compare` and `asv
continuous`). Only points where both commits have that series against the same anchor (its asv
benchmark version, the anchor's sha) are judged; the others show their raw times as "raw only"
and never decide.

The verdict comes first; then one row per case and implementation: raw time before -> after
(shown, never deciding), x anchor before -> after, the ratio, whether it counts, speedup over
naive and fraction of peak before -> after, and the status. A peer's speed (torch, FlashMLA: not
under test) is shown but does not decide the verdict. Failures and regressions first; unchanged
and raw-only rows are folded (dropped with --only-changed). The named cases that fail the gate
before Quick's timings (QuickCases) in B and did not in A are listed by name.

Exit codes:
  0  no counted slowdown (also when no point could be judged: raw only)
  1  a counted slowdown, on the drift-free series
  2  something failed in B that did not fail in A (a point failing in both is shown as "still
     failing" and does not decide); or a refusal: a revision that is not a commit, a
     malformed benchmarks.json, no machine with results of both commits, no asv
  3  a commit has no results at all (on --machine, else on any machine): record it first
  4  a malformed results file: one line names the file and the field (a parameter value that
     is not a Python literal, "results": null)
Names from the results files (implementations, cases, the machine) are escaped in the
markdown (verify_attn_tools/sanitize.py's cell): no mention, link, HTML or column break.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from . import ROOT
from .cli import Refusal, parser
from .sanitize import cell

BENCH = "bench_verify_attn"
TIME, ANCHOR = "track_time", "track_time_vs_anchor"
NA = (float("nan"), None, None)  # a point a series lacks: not measured
# Parameter names to short labels, in the order the asv classes declare them.
LABEL = {"batch": "b", "heads": "h", "q_len": "q", "prefix_len": "p"}


class NoResults(Refusal):
    """A commit has no results to compare: exit 3, so a caller tells "not measured yet" from a refusal."""


class Malformed(Refusal):
    """A results file without asv's shape: exit 4 (report and publish alike), one line naming the
    file and the field, before anything is judged or written."""

    def __init__(self, path, field: str, why: str):
        super().__init__(f"malformed results file {path}: field {field}: {why}")
        self.path, self.field = path, field


MALFORMED_EXIT = 4


def check_results_file(path: Path) -> None:
    """Raise Malformed unless path is a results file that asv and this tooling can read: JSON,
    an object; results an object of lists in result_columns' order; each benchmark's params a list
    of lists of Python literals (asv keeps parameter values as their repr), its result one value
    per combination. asv's own loader skips a bad file with a warning or stops with a traceback."""
    import ast

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Malformed(path, "(the file)", f"not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Malformed(path, "(top level)", f"a JSON object expected, got {type(data).__name__}")
    for field, kind in (("commit_hash", str), ("results", dict), ("result_columns", list), ("params", dict)):
        if not isinstance(data.get(field), kind):
            raise Malformed(path, field, f"{kind.__name__} expected, got {type(data.get(field)).__name__}")
    columns = data["result_columns"]
    if not all(isinstance(c, str) for c in columns) or "result" not in columns or "params" not in columns:
        raise Malformed(path, "result_columns", "a list of names holding 'result' and 'params' expected")
    if not isinstance(data.get("date"), (int, float)) or isinstance(data.get("date"), bool):
        raise Malformed(path, "date", f"a number expected, got {type(data.get('date')).__name__}")
    for name, row in data["results"].items():
        where = f"results[{name!r}]"
        if not isinstance(row, list) or len(row) > len(columns):
            raise Malformed(path, where, f"a list of at most {len(columns)} columns expected")
        entry = dict(zip(columns, row))
        params = entry.get("params")
        if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
            raise Malformed(path, f"{where}.params", "a list of lists of parameter values expected")
        for axis in params:
            for value in axis:
                try:
                    ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    raise Malformed(path, f"{where}.params", f"{str(value)[:60]!r} is not a Python literal") from None
        result = entry.get("result")
        combos = math.prod(len(axis) for axis in params)
        if result is not None and (not isinstance(result, list) or len(result) != combos
                                   or not all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in result)):
            raise Malformed(path, f"{where}.result", f"a list of {combos} numbers or nulls expected")
    try:
        from asv import results as asv_results

        asv_results.Results.load(str(path))
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 (asv's loader: whatever it trips on is named)
        raise Malformed(path, "(asv's loader)", f"{type(exc).__name__}: {exc}") from None


def check_results_dir(results_dir: Path) -> None:
    """check_results_file on every results file of every machine under results_dir."""
    for machine in sorted(p.parent for p in Path(results_dir).glob("*/machine.json")):
        for path in sorted(machine.glob("*.json")):
            if path.name != "machine.json":
                check_results_file(path)


@dataclass
class Row:
    case: str
    impl: str
    before: float | None       # raw seconds; None: failed, NaN: not measured
    after: float | None
    anchor: tuple              # x anchor (time over the anchor build's), (before, after); None: absent
    ratio: float | None        # after / before: of x anchor where judged, of the raw times where "raw"
    change: str                # "failed", "still failing", "slower", "faster", "fixed", "raw", "new", "gone", "same"
    judged: bool               # decided by the drift-free series
    significant: bool
    speedup: tuple             # over naive, (before, after)
    peak: tuple                # fraction of peak, (before, after)

    @property
    def order(self) -> int:
        return ["failed", "still failing", "slower", "faster", "fixed", "raw", "new", "gone", "same"].index(self.change)


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


def load(results_dir: Path, machine: str, commit: str) -> dict:
    """{benchmark key: (version, points)} of commit's results on machine, all read here so that a
    malformed file is refused in one line (asv's own iterator skips it with a warning, which
    would read as no results)."""
    from asv import results as asv_results, util

    files = sorted((results_dir / machine).glob(f"{commit[:8]}-*.json"))
    if not files:
        raise NoResults(f"no results of {commit[:8]} on {machine} under {results_dir}")
    check_results_file(files[0])
    try:
        res = asv_results.Results.load(str(files[0]), machine_name=machine)
        return {key: (res.benchmark_version.get(key), points(res, key)) for key in res.get_all_result_keys()
                if key.startswith(f"{BENCH}.")}
    except (util.UserError, OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, SyntaxError) as exc:
        raise Refusal(f"malformed results file {files[0]}: {exc}") from None


def points(res, key: str) -> dict:
    """{params tuple of literal values: (value, stats, samples)} of one benchmark."""
    import ast
    import itertools

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


def compare(a: dict, b: dict, benchmarks: dict, factor: float, bench: str) -> list[Row]:
    from asv.commands.compare import _is_result_better

    rows = []
    keys = sorted(k for k in set(a) | set(b) if k.endswith(f".{TIME}") and re.search(bench, k))
    for key in keys:
        cls = key.split(".")[1]

        def series(res: dict, metric: str) -> tuple:
            return res.get(f"{BENCH}.{cls}.{metric}", (None, {}))

        ta, tb = series(a, TIME)[1], series(b, TIME)[1]
        (version_a, xa), (version_b, xb) = series(a, ANCHOR), series(b, ANCHOR)
        if version_a != version_b:  # absent in one, or ratios to different anchors: nothing to compare
            xa = xb = {}
        for combo in sorted(set(ta) | set(tb), key=str):
            va, vb = ta.get(combo, NA)[0], tb.get(combo, NA)[0]
            if isna(va) and isna(vb) and not (va is None or vb is None):
                continue  # measured in neither: not this device's grid, or skipped both times
            pa, pb = xa.get(combo, NA), xb.get(combo, NA)
            ma, mb = (None if isna(p[0]) else median(p[2]) if p[2] else p[0] for p in (pa, pb))
            case, impl = label(cls, param_names(key, benchmarks, len(combo)), combo)
            ratio, judged, significant = None, False, False
            if (vb is None and va is not None) or (pb[0] is None and pa[0] is not None):
                change = "failed"
            elif va is None and vb is None:
                change = "still failing"
            elif va is None:
                change = "fixed" if not isna(vb) else "same"
            elif isna(va):
                change = "new"
            elif isna(vb):
                change = "gone"
            elif ma is None or mb is None:
                # Raw times of separate processes drift by several %: shown, never judged.
                change, ratio = "raw", vb / va if va > 0 else None
            else:
                ratio, judged = mb / ma, True
                if _is_result_better(ma, mb, pa[1:], pb[1:], factor):
                    change, significant = "slower", True
                elif _is_result_better(mb, ma, pb[1:], pa[1:], factor):
                    change, significant = "faster", True
                else:
                    change = "same"

            def inverse(metric):
                return tuple(None if isna(x) or not x else 1 / x
                             for x in (series(res, metric)[1].get(combo, NA)[0] for res in (a, b)))

            rows.append(Row(case, impl, va, vb, (ma, mb), ratio, change, judged, significant,
                            inverse("track_time_vs_naive"), inverse("track_time_vs_roofline")))
    # Within a kind, the largest moves first (the raw ones too, folded as they are).
    return sorted(rows, key=lambda r: (r.order, -(r.ratio or 0) if r.change in ("slower", "raw") else (r.ratio or 0),
                                       r.case, r.impl))


def failed_cases(a: dict, b: dict) -> list[str]:
    """"impl on case" for each named case of the Quick gate that fails in B and did not in A."""
    key = f"{BENCH}.QuickCases.track_error"
    pa, pb = a.get(key, (None, {}))[1], b.get(key, (None, {}))[1]
    return [f"{impl} on {case}" for (case, impl), (v, _, _) in sorted(pb.items())
            if v is None and pa.get((case, impl), (0,))[0] is not None]


def fmt_time(v) -> str:
    if v is None:
        return "failed"
    if isna(v):
        return "-"
    return f"{v * 1e3:.4g} ms"


def fmt_pair(pair, show) -> str:
    a, b = pair
    if a is None and b is None:
        return "-"
    return f"{show(a) if a is not None else '-'} → {show(b) if b is not None else '-'}"


STATUS = {"failed": "**FAILED**", "still failing": "still failing", "slower": "slower", "faster": "faster",
          "fixed": "fixed", "raw": "raw only (not judged)", "new": "new", "gone": "not run", "same": "ok"}
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
    still = [r for r in rows if r.change == "still failing"]
    raw = [r for r in rows if r.change == "raw"]
    code = 2 if failed or cases else 1 if slower else 0
    verdict = ("failed" if code == 2 else "slower" if slower else "faster" if faster
               else "not judged: no drift-free series for both commits" if raw and not any(r.judged for r in rows)
               else "no significant change")
    worst = max((r.ratio for r in slower), default=None)
    best = min((r.ratio for r in faster), default=None)
    detail = ", ".join(filter(None, [
        f"{len(cases)} named case{'s' if len(cases) > 1 else ''} failed" if cases else "",
        f"{len(failed)} failed" if failed else "",
        f"{len(still)} still failing" if still else "",
        f"{len(slower)} slower (worst x{worst:.3f})" if slower else "",
        f"{len(faster)} faster (best x{best:.3f})" if faster else "",
        f"{len(raw)} raw only" if raw else ""])) or "within the rule"
    lines = [f"### verify-attn {a[:8]} → {b[:8]} on {cell(machine)}: **{verdict}** ({detail}, {len(rows)} points)", "",
             f"A change counts when the drift-free ratio after/before passes {factor} (or 1/{factor}) and asv's "
             "Mann-Whitney test on the recorded samples says they differ (p < 0.002). Drift-free: each sample is "
             "the time over a frozen anchor build's, timed alternately in the same process (x anchor). Time is "
             "the raw median per call, shown but not deciding; speedup over naive and % of peak from the same "
             "runs.", ""]
    if raw:
        lines += ["Raw only (not judged): one of the two commits lacks the drift-free series there (or recorded "
                  "it against another anchor); raw times of separate processes and machine starts drift by "
                  "several %, so they are not judged.", ""]
    if cases:
        lines += [f"Named cases failing at {b[:8]}, so nothing of Quick was timed (tolerances: "
                  f"verify_attn/accuracy.py): {', '.join(map(cell, cases))}.", ""]
    head = "| case | impl | before | after | x anchor | ratio | counts | x naive | % of peak | status |"
    sep = "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"

    def line(r: Row) -> str:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}" + (" (raw)" if r.change == "raw" else "")
        return (f"| {cell(r.case)} | {cell(r.impl)} | {fmt_time(r.before)} | {fmt_time(r.after)} | "
                f"{fmt_pair(r.anchor, lambda x: f'{x:.4f}')} | {ratio} | {'yes' if r.significant else 'no'} | "
                f"{fmt_pair(r.speedup, lambda x: f'{x:.3g}x')} | {fmt_pair(r.peak, lambda x: f'{100 * x:.3g}%')} | "
                f"{STATUS[r.change]}{'' if counts(r.impl) or not r.significant else ' (a peer: not counted)'} |")

    changed = [r for r in rows if r.change not in ("same", "raw", "new", "gone")]
    if changed:
        lines += [head, sep, *map(line, changed)]
    for kind, what in (("new", f"Measured in {b[:8]} only"), ("gone", f"Measured in {a[:8]} only (not run after)")):
        by_impl: dict[str, int] = {}
        for r in rows:
            if r.change == kind:
                by_impl[r.impl] = by_impl.get(r.impl, 0) + 1
        if by_impl:
            lines += ["", f"{what}: " + ", ".join(f"{cell(impl)} at {n} points" for impl, n in sorted(by_impl.items())) + "."]
    for folded, what in ((raw, "raw only, not judged"), ([r for r in rows if r.change == "same"], "unchanged")):
        if folded and not only_changed:
            lines += ["", f"<details><summary>{len(folded)} {what}</summary>", "", head, sep, *map(line, folded), "",
                      "</details>"]
        elif folded:
            lines += ["", f"{len(folded)} points {what}: not shown (--only-changed)."]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n", code  # one blank line where sections are absent


def main(argv=None) -> int:
    try:
        return report(argv)
    except Refusal as exc:
        print(f"python -m verify_attn report: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, NoResults) else MALFORMED_EXIT if isinstance(exc, Malformed) else 2


def report(argv) -> int:
    p = parser("report", __doc__)
    p.add_argument("before", help="the base commit (a hash, a branch, HEAD~1)")
    p.add_argument("after", help="the commit under review")
    p.add_argument("--machine", help="asv machine under results/ (default: the one that has both commits; "
                                     "with several, this box's, else the first)")
    p.add_argument("--factor", type=float, default=1.03, help="the change a ratio must pass (default 1.03)")
    p.add_argument("-b", "--bench", default="", help="only benchmarks matching this regex (e.g. Quick)")
    p.add_argument("--only-changed", action="store_true",
                   help="drop the unchanged and raw-only rows instead of folding them")
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
            missing = [h[:8] for h in (a, b) if not machines_with(args.results, h)]
            if missing:
                raise NoResults(f"no results of {' and '.join(missing)} on any machine under {args.results}")
            raise Refusal(f"no machine under {args.results} has results for both {a[:8]} and {b[:8]}")
        from verify_attn import suite
        from verify_attn.machine import asv_machine_name

        here = asv_machine_name(suite.device())
        machine = here if here in candidates else candidates[0]
    a_res, b_res = load(args.results, machine, a), load(args.results, machine, b)
    bench_file = args.results / "benchmarks.json"
    try:
        benchmarks = json.loads(bench_file.read_text()) if bench_file.exists() else {}
    except ValueError as exc:
        raise Refusal(f"malformed {bench_file}: {exc}") from None
    rows = compare(a_res, b_res, benchmarks, args.factor, args.bench)
    cases = failed_cases(a_res, b_res) if re.search(args.bench, f"{BENCH}.QuickCases.track_error") else []
    text, code = markdown(rows, a, b, machine, args.factor, args.only_changed, cases)
    if args.json:
        print(json.dumps({"before": a, "after": b, "machine": machine, "factor": args.factor, "exit": code,
                          "failed_cases": cases, "rows": [asdict(r) | {"case": r.case} for r in rows]}, indent=1))
    else:
        print(text, end="")
    return code
