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

A commit that changed no measured path against its first parent (history.py's measured code)
has the code of its nearest first-parent ancestor that did: without results of its own, that
ancestor's are used, and a line says so. Two commits with the same measured code are "same
measured code": nothing to judge, exit 0.

The verdict comes first; then one row per case and implementation: raw time before -> after
(shown, never deciding), x anchor before -> after, the ratio, whether it counts, speedup over
naive and fraction of peak before -> after, and the status. A peer's speed (torch, FlashMLA: not
under test) is shown but does not decide the verdict. Failures and regressions first; unchanged
and raw-only rows are folded (dropped with --only-changed). The named cases that fail the gate
before Quick's timings (QuickCases) in B and did not in A are listed by name.

Exit codes:
  0  no counted slowdown (also when no point could be judged: raw only; or the same measured code)
  1  a counted slowdown, on the drift-free series
  2  something failed in B that did not fail in A (a point failing in both is shown as "still
     failing" and does not decide); or a refusal: a revision that is not a commit, a -b
     that is not a regex or matches no benchmark of either commit (-b quick: not Quick), a
     malformed benchmarks.json, no machine with results of both commits, no asv
  3  a commit has no results at all (on --machine, else on any machine; the ancestor whose
     measured code it has, named, where it changed none): record it first
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
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from . import ROOT, artifacts, history
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
    """Raise Malformed unless path is a results file that asv and this tooling can read: JSON of
    asv's result shape (artifacts.check_shape, the check the hosted record job runs), and what
    only this tooling relies on: result_columns holding result and params, each benchmark's
    params a list of lists of Python literals (asv keeps parameter values as their repr), its
    result one value per combination, and asv's own loader taking the file (it skips a bad file
    with a warning or stops with a traceback)."""
    import ast

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Malformed(path, "(the file)", f"not readable JSON ({exc})") from None
    try:
        artifacts.check_shape(data, str(path))
    except artifacts.Refused as exc:
        raise Malformed(path, exc.field or "(the file)", exc.why or str(exc)) from None
    columns = data["result_columns"]
    if "result" not in columns or "params" not in columns:
        raise Malformed(path, "result_columns", "a list of names holding 'result' and 'params' expected")
    for name, row in data["results"].items():
        where = f"results[{name!r}]"
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
    spread: tuple = (None, None)  # IQR / median of each commit's samples of the judged series (asv's q_25, q_75)
    series: str = ""           # the benchmark the change was read from (its asv graph)
    params: dict = dataclasses.field(default_factory=dict)  # {parameter name: asv's repr of the value}
    accepted: str = ""         # slower, and accepted at this commit (benchmarks/accepted.json)

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


def named(rev: str, sha: str) -> str:
    """A commit as the user named it, with its hash: "HEAD (049c8d79)", or the hash alone."""
    return sha[:8] if sha.startswith(rev) else f"{rev} ({sha[:8]})"


def results_of(results_dir: Path, machine: str, sha: str, code: str) -> str | None:
    """The commit whose results on machine stand for sha's: its own, else those of code, the
    commit whose measured code sha has (history.measured_code); None where neither has any."""
    return next((c for c in dict.fromkeys((sha, code)) if machine in machines_with(results_dir, c)), None)


def choose_machine(results_dir: Path, machine: str | None, sides: list[tuple[str, str, str]]) -> tuple[str, list[str]]:
    """The machine to compare on and, per side (rev, sha, code), the commit whose results are
    used there (results_of): --machine, else one with results for both sides, this box's if
    it is one, else the first. NoResults names the commit whose results a side lacks."""
    known = [machine] if machine else sorted(p.parent.name for p in results_dir.glob("*/machine.json"))
    found = {m: [results_of(results_dir, m, sha, code) for _, sha, code in sides] for m in known}
    both = [m for m, used in found.items() if all(used)]
    if not both:
        lacking = dict.fromkeys(code[:8] if code == sha else f"{code[:8]} (the measured code of {named(rev, sha)})"
                                for n, (rev, sha, code) in enumerate(sides) if not any(found[m][n] for m in known))
        if lacking:
            where = f"on {machine}" if machine else "on any machine"
            raise NoResults(f"no results of {' and '.join(lacking)} {where} under {results_dir}")
        raise Refusal(f"no machine under {results_dir} has results for both {sides[0][1][:8]} and {sides[1][1][:8]}")
    if machine is None:
        from verify_attn import suite
        from verify_attn.machine import asv_machine_name

        here = asv_machine_name(suite.device())
        machine = here if here in both else both[0]
    return machine, found[machine]


def same_code(sides: list[tuple[str, str, str]], as_json: bool) -> int:
    """The answer where both sides have one commit's measured code: nothing to judge, exit 0."""
    (rev_a, a, code), (rev_b, b, _) = sides
    verdict = f"### verify-attn {a[:8]} → {b[:8]}: **same measured code**"
    if a == b:
        line = (f"{named(' and '.join(dict.fromkeys((rev_a, rev_b))), a)} on both sides: one commit, the measured "
                f"code of {code[:8]}, so there is nothing to judge.")
    else:
        line = (f"{named(rev_a, a)} and {named(rev_b, b)} both measure the code of {code[:8]}: no measured path "
                "differs, so there is nothing to judge.")
    if as_json:
        print(json.dumps({"before": a, "after": b, "machine": None, "exit": 0, "rule": "same measured code",
                          "verdict": verdict, "notes": [line], "failed_cases": [], "rows": [], "ab": None}, indent=1))
    else:
        print(f"{verdict}\n\n{line}")
    return 0


def load(results_dir: Path, machine: str, commit: str, suites: tuple[str, ...] = (BENCH,)) -> dict:
    """{benchmark key: (version, points)} of commit's results on machine for the benchmark
    modules `suites`, all read here so that a malformed file is refused in one line (asv's own
    iterator skips it with a warning, which would read as no results)."""
    from asv import results as asv_results, util

    files = sorted((results_dir / machine).glob(f"{commit[:8]}-*.json"))
    if not files:
        raise NoResults(f"no results of {commit[:8]} on {machine} under {results_dir}")
    check_results_file(files[0])
    try:
        res = asv_results.Results.load(str(files[0]), machine_name=machine)
        return {key: (res.benchmark_version.get(key), points(res, key)) for key in res.get_all_result_keys()
                if key.split(".")[0] in suites}
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


def not_judged(root: Path = ROOT) -> list[re.Pattern]:
    """The series benchmarks/accepted.json takes off the judged list with commit null (ColdL2's
    pairs, the peers'): report shows them as the regressions page does, not deciding."""
    from . import regressions

    try:
        return regressions.not_judged(root)
    except regressions.AcceptedError as exc:
        raise Refusal(str(exc)) from None


def compare(a: dict, b: dict, benchmarks: dict, factor: float, bench: str,
            accepted: list[tuple[str, re.Pattern]] = ()) -> list[Row]:
    """Rows of every timed point of A and B. accepted: (commit, series regex) of the steps
    benchmarks/accepted.json accepts between the two (regressions.accepted_between): a slower
    row of such a series is marked, and does not decide."""
    from asv.commands.compare import _is_result_better

    unjudged = not_judged()
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
            # Series names as asv writes them (the regexes of accepted.json match those).
            names_of = [series_name(cls, metric, combo) for metric in (TIME, ANCHOR)]
            if any(r.search(names_of[1]) for r in unjudged):
                ma = mb = None  # shown with its raw times, never deciding
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

            names = param_names(key, benchmarks, len(combo))
            judged_on = (pa, pb) if ma is not None and mb is not None else (ta.get(combo, NA), tb.get(combo, NA))
            rows.append(Row(case, impl, va, vb, (ma, mb), ratio, change, judged, significant,
                            inverse("track_time_vs_naive"), inverse("track_time_vs_roofline"),
                            tuple(map(iqr_fraction, judged_on)),
                            f"{BENCH}.{cls}.{ANCHOR if judged_on[0] is pa else TIME}",
                            {n: repr(v) for n, v in zip(names, combo)},
                            next((c for c, r in accepted if change == "slower"
                                  and any(r.match(n) for n in names_of)), "")))
    # Within a kind, the largest moves first (the raw ones too, folded as they are).
    return sorted(rows, key=lambda r: (r.order, -(r.ratio or 0) if r.change in ("slower", "raw") else (r.ratio or 0),
                                       r.case, r.impl))


def iqr_fraction(point: tuple) -> float | None:
    """The interquartile range over the median of one point's samples, from asv's recorded stats
    (q_25, q_75; computed by asv from the samples when it saved them)."""
    value, stats, _ = point
    if isna(value) or not value or not isinstance(stats, dict):
        return None
    q25, q75 = stats.get("q_25"), stats.get("q_75")
    return None if isna(q25) or isna(q75) else (q75 - q25) / value


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


FACTOR = 1.03  # the change a drift-free ratio must pass to count (report's default --factor)


def change_words(ratio) -> str:
    """A time ratio after/before in words: "1.32x faster", "1.8% slower" (percent under 10%)."""
    if ratio is None or isna(ratio) or ratio <= 0 or math.isinf(ratio):
        return "-"
    if abs(ratio - 1) < 5e-4:
        return "same"
    word, factor = ("slower", ratio) if ratio > 1 else ("faster", 1 / ratio)
    return f"{100 * (factor - 1):.1f}% {word}" if factor < 1.1 else f"{factor:.2f}x {word}"


def fmt_spread(pair) -> str:
    return " / ".join("-" if x is None else f"{100 * x:.1f}%" for x in pair) if any(x is not None for x in pair) else "-"


STATUS = {"failed": "**FAILED**", "still failing": "still failing", "slower": "**slower**", "faster": "faster",
          "fixed": "fixed", "raw": "raw only (not judged)", "new": "new", "gone": "not run", "same": "ok"}
AB_STATUS = {"failed": "**FAILED**", "slower": "**slower**", "faster": "faster", "same": "ok",
             "base failed": "base failed", "new": "new (not in the base)"}
AB_ORDER = ["failed", "slower", "base failed", "new", "faster", "same"]
HEAD = ("| point | impl | before | after | change | spread | evidence | x naive | % of peak | status |\n"
        "| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | --- |")


def series_name(cls: str, metric: str, combo: tuple) -> str:
    """A point's series as asv names it (the regexes of accepted.json match these)."""
    return f"{BENCH}.{cls}.{metric}({', '.join(map(repr, combo))})"


def counts(impl: str) -> bool:
    """Whether impl's speed decides the verdict: a kernel under test (or one no longer registered)."""
    from verify_attn import registry

    entry = registry.IMPLS.get(impl)
    return entry is None or entry.under_test


def after_of(pair):
    """The after commit's value of a (before, after) pair, else the before commit's."""
    return pair[1] if pair[1] is not None else pair[0]


def report_line(r: Row) -> str:
    """One table row of asv's recorded results."""
    if r.judged:
        evidence = (f"x anchor {r.anchor[0]:.4f} → {r.anchor[1]:.4f}, "
                    + ("differ (Mann-Whitney p < 0.002)" if r.significant else "not significant"))
    elif r.change == "raw":
        evidence = "raw times only"
    else:
        evidence = "-"
    change = change_words(r.ratio) + (" (raw)" if r.change == "raw" and r.ratio is not None else "")
    peer = "" if counts(r.impl) or not r.significant else " (a peer: not counted)"
    accepted = f" (accepted at {r.accepted}: benchmarks/accepted.json)" if r.accepted else ""
    speed, peak = after_of(r.speedup), after_of(r.peak)
    return (f"| {cell(r.case)} | {cell(r.impl)} | {fmt_time(r.before)} | {fmt_time(r.after)} | {change} | "
            f"{fmt_spread(r.spread)} | {evidence} | {'-' if speed is None else f'{speed:.3g}x'} | "
            f"{'-' if peak is None else f'{100 * peak:.3g}%'} | {STATUS[r.change]}{peer}{accepted} |")


# What ab found of a slower kernel's machine code in both builds (its rows' "code").
CODE_WORDS = {"identical": " (machine code identical)", "moved": " (machine code moved)",
              "plan": " (launch plan changed)"}
IDENTICAL_NOTE = ("Machine code identical: that kernel compiles to the same instructions in both builds "
                  "(`python -m verify_attn sass BASE`) and both take the same launch plan there, so a slower "
                  "reading is the level of two loaded copies of "
                  "one kernel, not the change (docs/timing.md, \"Two copies of one kernel\").")
# ab's --points and the asv class whose points they are (one name a point from ab to the graphs).
AB_CLASS = {"quick": "Quick", "chain": "Chain", "serving": "Serving", "serving_chain": "ServingChain"}


def ab_line(r: dict, asv_rows: dict, cls: str = "Quick") -> str:
    """One table row of the paired check (ab's --json rows; cls: the asv class of its points);
    x naive and % of peak from asv's recorded results of the after commit at the same point,
    where there are some."""
    point, impl, status = str(r.get("point", "")), str(r.get("impl", "")), str(r.get("status", ""))
    twin = asv_rows.get((f"{cls} {point}", impl))
    speed, peak = (after_of(twin.speedup), after_of(twin.peak)) if twin else (None, None)
    ratio = num(r.get("ratio"))
    if ratio is None:
        return (f"| {cls} {cell(point)} | {cell(impl)} | | | | | {cell(r.get('reason', ''))} | | | "
                f"{AB_STATUS.get(status, cell(status))} |")
    spread = "-"
    iqr = r.get("iqr")
    if isinstance(iqr, list) and len(iqr) == 2 and all(num(x) is not None for x in iqr):
        spread = f"{100 * (iqr[1] - iqr[0]) / ratio:.1f}%"
    p = num(r.get("p"))
    evidence = f"{int(num(r.get('slower')) or 0)}/{int(num(r.get('pairs')) or 0)} pairs slower" + (
        "" if p is None else f", sign test p {p:.2g}")
    return (f"| {cls} {cell(point)} | {cell(impl)} | {fmt_time(num(r.get('base_s')))} | "
            f"{fmt_time(num(r.get('head_s')))} | {change_words(ratio)} | {spread} | {evidence} | "
            f"{'-' if speed is None else f'{speed:.3g}x'} | {'-' if peak is None else f'{100 * peak:.3g}%'} | "
            f"{AB_STATUS.get(status, cell(status))}{ab_code_words(r)} |")


def ab_code_words(r: dict) -> str:
    """What ab found of a slower kernel's machine code in both builds, if it compared it."""
    return CODE_WORDS.get(r.get("code"), "") if r.get("status") == "slower" else ""


def num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def judged_words(decided: int, judged: int) -> str:
    """How many of the counted points the drift-free series judged (the others: raw only, or failed)."""
    if not decided:
        return ""
    return ", all judged" if judged == decided else ", none judged" if not judged else f", {judged} of them judged"


def folded(summary: str, lines: list[str]) -> list[str]:
    return ["", f"<details><summary>{summary}</summary>", "", HEAD, *lines, "", "</details>"] if lines else []


def graph_url(site: str | None, machine: str, series: str, params: dict) -> str | None:
    """The asv graph page of one point (asv's hash: benchmark?machine=..&p-name=repr), or None."""
    if not site:
        return None
    from urllib.parse import quote

    query = "&".join([f"machine={quote(machine, safe='')}"]
                     + [f"p-{quote(n, safe='')}={quote(v, safe='')}" for n, v in params.items()])
    return f"{site.rstrip('/')}/#{quote(series, safe='.')}?{query}"


def ab_params(point: str, impl: str) -> dict:
    """asv's parameters of an ab point ("h64 q9 p2048", or "b8 h16 q9" at the serving steps)."""
    names = {"b": "batch", "h": "heads", "q": "q_len", "p": "prefix_len"}
    out = {names[part[0]]: part[1:] for part in point.split() if part[:1] in names and part[1:].isdigit()}
    return {**out, "impl": repr(impl)}


def markdown(rows: list[Row], a: str, b: str, machine: str, factor: float, only_changed: bool,
             cases: list[str] = (), ab: dict | None = None, info: dict | None = None) -> tuple[str, int]:
    """The pull request's one comment and its exit code. One verdict by one rule: the paired
    check's (ab, given where kernels/ changed) when ab is given, else asv's recorded results on
    the drift-free series. The rows that decide come first, then the rest folded, the peers
    last."""
    info = info or {}
    counted = [r for r in rows if counts(r.impl)]
    peers = [r for r in rows if not counts(r.impl)]
    failed = [r for r in rows if r.change == "failed"]
    still = [r for r in rows if r.change == "still failing"]
    raw = [r for r in counted if r.change == "raw"]
    by_point = {(r.case, r.impl): r for r in rows}
    if ab is not None:
        ab_rows = sorted((r for r in ab["rows"]), key=lambda r: (AB_ORDER.index(r["status"]) if r["status"] in AB_ORDER
                                                                 else len(AB_ORDER), str(r.get("point")), str(r.get("impl"))))
        slower = [r for r in ab_rows if r["status"] == "slower"]
        faster = [r for r in ab_rows if r["status"] == "faster"]
        ab_failed = ab.get("exit") == 2 or ab.get("failed") or any(r["status"] == "failed" for r in ab_rows)
        code = 2 if failed or cases or ab_failed else 1 if slower else 0
        judged_any = any(num(r.get("ratio")) is not None for r in ab_rows)

        # A row's asv class: its own selection (ab's --points); a file from before rows carried
        # one names its single selection as a string.
        points = ab.get("points", "quick")
        old_points = points if isinstance(points, str) else "quick"

        def ab_cls(r):
            return AB_CLASS.get(str(r.get("selection") or old_points), "Quick")

        def where(r):
            return f"{cell(r.get('impl'))} at {ab_cls(r)} {cell(r.get('point'))}"

        def ratio_of(r):
            return num(r.get("ratio"))
    else:
        slower = [r for r in counted if r.change == "slower" and not r.accepted]
        faster = [r for r in counted if r.change == "faster"]
        code = 2 if failed or cases else 1 if slower else 0
        judged_any = any(r.judged for r in counted)

        def where(r):
            return f"{cell(r.impl)} at {cell(r.case)}"

        def ratio_of(r):
            return r.ratio
    verdict = ("failed" if code == 2 else "slower" if slower else "faster" if faster
               else "accepted steps only" if ab is None and any(r.accepted for r in counted)
               else "no significant change" if judged_any
               else "not judged: no drift-free series for both commits" if ab is None and raw
               else "not judged: no point measured in both commits")
    detail = []
    if cases:
        detail.append(f"{len(cases)} named case{'s' if len(cases) > 1 else ''} failed")
    if failed:
        detail.append(f"{len(failed)} failed in asv's run")
    if ab is not None and ab.get("failed"):
        detail.append(f"{len(ab['failed'])} named case{'s' if len(ab['failed']) > 1 else ''} failed in the paired check")
    if ab is not None and ab.get("exit") == 2 and not ab.get("failed") and not ab["rows"]:
        detail.append("the paired check refused (see the job log)")
    if slower:
        worst = max(slower, key=ratio_of)
        detail.append(f"{len(slower)} slower, worst {where(worst)} {change_words(ratio_of(worst))}")
    stepped = [r for r in counted if r.accepted] if ab is None else []
    if stepped:
        worst = max(stepped, key=ratio_of)
        detail.append(f"{len(stepped)} slower as accepted in benchmarks/accepted.json at "
                      f"{', '.join(sorted({r.accepted for r in stepped}))}, worst {where(worst)} "
                      f"{change_words(ratio_of(worst))}")
    if faster:
        best = min(faster, key=ratio_of)
        detail.append(f"{len(faster)} faster, best {where(best)} {change_words(ratio_of(best))}")
    if still:
        detail.append(f"{len(still)} still failing")
    if raw and ab is None:
        detail.append(f"{len(raw)} raw only, not judged")
    decided = len(ab["rows"]) if ab is not None else sum(r.change not in ("new", "gone") for r in counted)
    tally = f"{decided} counted points" + ("" if ab is not None else judged_words(decided, sum(r.judged for r in counted)))
    lines = [f"### verify-attn {a[:8]} → {b[:8]} on {cell(machine)}: **{verdict}**",
             "", f"{'; '.join(detail) or ('within the rule' if decided else 'nothing to judge')} ({tally}).", "",
             *info.get("notes", ()), ""]
    if ab is not None:
        lines += [f"**Rule:** `kernels/` changed, so the paired check decides: the base's and the head's kernels "
                  f"built side by side and timed in turn in one process on the same inputs (`python -m verify_attn "
                  f"ab`); a kernel is slower (faster) at a point when the median of its pairs' head/base time "
                  f"ratios is over {num(ab.get('factor')) or 1.01:g} (under its inverse) and the sign test over the "
                  f"pairs gives p < {num(ab.get('alpha')) or 0.01:g}. Spread: the interquartile range of the pairs' "
                  "ratios over their median. asv's recorded results are folded below, shown, not deciding; a "
                  "failure in either fails the check.", ""]
    else:
        why = ("`kernels/` changed but no paired check was given (`--ab`), so" if info.get("kernels_changed")
               else "No kernel changed (`kernels/` is the same in both commits), so")
        lines += [f"**Rule:** {why} asv's recorded results decide, on the drift-free series: a point is slower "
                  f"(faster) when its time over a frozen anchor build's (the two timed in turn in one process, "
                  f"x anchor) moved past {factor:g} (its inverse) and asv's Mann-Whitney test on the samples says "
                  "they differ (p < 0.002). Raw times are shown, not deciding; so is a slower point of a series "
                  "that benchmarks/accepted.json accepts at a commit after the base, up to the head. Spread: the "
                  "interquartile range over the median of each commit's samples of that series (asv's q_25, "
                  "q_75), before / after.", ""]
    if raw and ab is None:
        lines += ["Raw only (not judged): one of the two commits lacks the drift-free series there (or recorded it "
                  "against another anchor); raw times of separate processes and machine starts drift by several %, "
                  "so they are not judged.", ""]
    lines += context_lines(a, b, machine, info, ab, rows)
    if cases:
        lines += [f"Named cases failing at {b[:8]}, so nothing of Quick was timed (tolerances: "
                  f"verify_attn/accuracy.py): {', '.join(map(cell, cases))}.", ""]
    if ab is not None and ab.get("failed"):
        lines += ["The paired check's gate: the checkout fails named cases, nothing was timed: "
                  + ", ".join(map(cell, ab["failed"])) + ".", ""]
    if ab is not None and any(r.get("status") == "slower" and r.get("code") == "identical" for r in ab_rows):
        lines += [IDENTICAL_NOTE, ""]
    graphs = []
    if ab is not None:
        decide = [ab_line(r, by_point, ab_cls(r)) for r in ab_rows if r["status"] != "same"] + [report_line(r) for r in failed]
        same = [ab_line(r, by_point, ab_cls(r)) for r in ab_rows if r["status"] == "same"]
        graphs = [(f"{r['impl']} at {ab_cls(r)} {r['point']}", f"{BENCH}.{ab_cls(r)}.{ANCHOR}",
                   ab_params(str(r["point"]), str(r["impl"])))
                  for r in ab_rows if r["status"] in ("failed", "slower", "faster")]
        rest = [("counted points unchanged (the paired check)", same),
                ("counted points, asv's recorded results (shown, not deciding here)",
                 [report_line(r) for r in counted if r.change != "failed"])]
    else:
        moved = [r for r in counted if r.change not in ("same", "raw", "new", "gone")]
        decide = [report_line(r) for r in moved] + [report_line(r) for r in failed if not counts(r.impl)]
        graphs = [(f"{r.impl} at {r.case}", r.series, r.params) for r in moved if r.series]
        rest = [("counted points judged, unchanged", [report_line(r) for r in counted if r.change == "same"]),
                ("counted points raw only, not judged", [report_line(r) for r in raw])]
    if decide:
        lines += [HEAD, *decide]
    elif not any(x for _, x in rest):
        lines += ["No counted point was measured in both commits."]
    links = [(what, url) for what, series, params in graphs[:8]
             if (url := graph_url(info.get("site_url"), machine, series, params))]
    if links:
        lines += ["", "Graphs (asv, drift-free series): " + "; ".join(f"{cell(w)}: {u}" for w, u in links)]
    for kind, what in (("new", f"Measured in {b[:8]} only"), ("gone", f"Measured in {a[:8]} only (not run after)")):
        by_impl: dict[str, int] = {}
        for r in rows:
            if r.change == kind:
                by_impl[r.impl] = by_impl.get(r.impl, 0) + 1
        if by_impl:
            lines += ["", f"{what} (asv): " + ", ".join(f"{cell(impl)} at {n} points" for impl, n in sorted(by_impl.items())) + "."]
    peer_names = ", ".join(sorted({cell(r.impl) for r in peers}))
    shown_peers = [r for r in peers if r.change not in ("new", "gone") and not (only_changed and r.change in ("same", "raw"))]
    rest.append((f"peers ({peer_names}): shown, never counted", [report_line(r) for r in shown_peers]))
    for n, (summary, body) in enumerate(rest):
        if body and (not only_changed or n == len(rest) - 1):
            lines += folded(f"{len(body)} {summary}", body)
        elif body:
            lines += ["", f"{len(body)} {summary}: not shown (--only-changed)."]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n", code  # one blank line where sections are absent


def context_lines(a: str, b: str, machine: str, info: dict, ab: dict | None, rows: list[Row]) -> list[str]:
    """The commits (linked where the repository's address is known), the graphs' site, the GPU and
    its clocks: what a reader needs to trust the numbers."""
    url = info.get("commit_url")
    commits = (f"**Commits:** before {a[:8]} {url}{a}, after {b[:8]} {url}{b}" if url
               else f"**Commits:** before {a[:8]}, after {b[:8]}")
    if info.get("site_url"):
        commits += f"; graphs: {graph_url(info['site_url'], machine, f'{BENCH}.Quick.{ANCHOR}', {})}"
    gpu = [f"**GPU:** {cell(machine)}"]
    details = info.get("machine_details") or {}
    if details:
        gpu[0] += " (" + ", ".join(f"{cell(k)} {cell(v)}" for k, v in details.items()) + ")"
    if ab is not None and ab.get("gpu"):
        gpu.append(f"the paired check ran on {cell(ab['gpu'])}")
    peaks = info.get("peaks")
    if peaks:
        gpu.append(f"peaks {peaks[0]:.0f} TFLOP/s and {peaks[1]:.0f} GB/s (recorded)")
    clocks = info.get("clocks") or (None, None)

    def span(values):
        return None if not values else (f"{min(values):.0f} MHz" if min(values) == max(values)
                                        else f"{min(values):.0f}-{max(values):.0f} MHz")

    shown = [f"{what} {span(v)}" for what, v in (("before", clocks[0]), ("after", clocks[1])) if span(v)]
    if ab is not None:
        paired = [c for r in ab["rows"] if (c := num(r.get("clock_mhz"))) is not None]
        if span(paired):
            shown.append(f"paired check {span(paired)}")
    gpu.append("SM clock, median of each point's samples: " + ", ".join(shown) if shown
               else "SM clock not recorded (no NVML on this machine)")
    return [commits, "", "; ".join(gpu) + ".", ""]


def machine_info(results_dir: Path, machine: str, commit: str) -> dict:
    """From a commit's (already checked) results file: the machine's details asv recorded with it
    beyond its name and python, and the peaks bench_machine recorded."""
    files = sorted((results_dir / machine).glob(f"{commit[:8]}-*.json"))
    data = json.loads(files[0].read_text())
    details = {k: v for k, v in data["params"].items() if k not in ("machine", "python") and isinstance(v, (str, int, float))}
    column = data["result_columns"].index("result")

    def scalar(name):
        row = data["results"].get(f"bench_machine.Machine.{name}")
        value = row[column] if row and len(row) > column else None
        value = value[0] if isinstance(value, list) and value else value
        return num(value)

    tflops, gbps = scalar("track_peak_tflops"), scalar("track_peak_gbps")
    return {"machine_details": details, "peaks": (tflops, gbps) if tflops and gbps else None}


def clocks_of(res: dict, bench: str) -> list[float]:
    """The median SM clocks recorded at every point of the benchmarks bench selects."""
    return [v for key, (_, pts) in res.items() if key.endswith(".track_sm_clock") and re.search(bench, key)
            for v, _, _ in pts.values() if not isna(v) and v > 0]


def load_ab(path: Path) -> dict:
    """The paired check's --json file, as far as the comment reads it; a refusal when it is not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Refusal(f"--ab {path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not isinstance(data.get("exit"), int) or \
            not all(isinstance(r, dict) and isinstance(r.get("status"), str) for r in data["rows"]) or \
            not isinstance(data.get("failed", []), list):
        raise Refusal(f"--ab {path}: not the JSON of `python -m verify_attn ab --json` (rows, exit)")
    return data


def kernels_changed(a: str, b: str) -> bool | None:
    """Whether kernels/ differs between the two commits (None: git cannot tell)."""
    proc = subprocess.run(["git", "diff", "--quiet", a, b, "--", "kernels"], cwd=ROOT, capture_output=True)
    return {0: False, 1: True}.get(proc.returncode)


def site_url() -> str | None:
    """The published asv site: $VERIFY_ATTN_SITE_URL (set and empty: none), else the GitHub Pages
    address of the GitHub repository that origin names (where gpu-main.yml deploys it)."""
    import os

    from .regressions import GITHUB, git

    if "VERIFY_ATTN_SITE_URL" in os.environ:
        return os.environ["VERIFY_ATTN_SITE_URL"] or None
    match = GITHUB.fullmatch(git(ROOT, "remote", "get-url", "origin").stdout.strip())
    return f"https://{match['owner'].lower()}.github.io/{match['repo']}/" if match else None


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
    p.add_argument("--factor", type=float, default=FACTOR, help=f"the change a ratio must pass (default {FACTOR})")
    p.add_argument("-b", "--bench", default="", help="only benchmarks matching this regex (e.g. Quick)")
    p.add_argument("--only-changed", action="store_true",
                   help="drop the unchanged and raw-only rows instead of folding them")
    p.add_argument("--ab", type=Path, metavar="FILE",
                   help="the paired check's rows (`python -m verify_attn ab BEFORE --json FILE`, run where kernels/ "
                        "changed): then its verdict is the comment's, asv's rows shown beside it")
    p.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    p.add_argument("--results", type=Path, default=ROOT / "results", help="asv results directory")
    args = p.parse_args(argv)
    try:
        import asv  # noqa: F401
    except ImportError:
        raise Refusal(f"asv is not installed for {sys.executable}: run `bash test.sh` or `bash bench.sh` "
                      "first, which set it up") from None
    try:
        re.compile(args.bench)
    except re.error as exc:
        raise Refusal(f"-b {args.bench!r} is not a regex ({exc})") from None
    revs = (args.before, args.after)
    sides = [(rev, sha, history.measured_code(ROOT, sha)) for rev, sha in zip(revs, map(git_hash, revs))]
    (_, a, code_a), (_, b, code_b) = sides
    if code_a == code_b:
        return same_code(sides, args.json)
    machine, (used_a, used_b) = choose_machine(args.results, args.machine, sides)
    notes = [f"{named(rev, sha)} measures the code of {used[:8]}, whose results are used."
             for (rev, sha, _), used in zip(sides, (used_a, used_b)) if used != sha]
    a_res, b_res = load(args.results, machine, used_a), load(args.results, machine, used_b)
    if not any(re.search(args.bench, key) for key in {*a_res, *b_res}):
        # A typo (-b quick) would otherwise read as "nothing to judge" and pass.
        raise Refusal(f"no benchmark matches {args.bench!r} in the results of {used_a[:8]} and {used_b[:8]} "
                      f"(-b is a case-sensitive regex over names such as {BENCH}.Quick.{TIME})")
    bench_file = args.results / "benchmarks.json"
    try:
        benchmarks = json.loads(bench_file.read_text()) if bench_file.exists() else {}
    except ValueError as exc:
        raise Refusal(f"malformed {bench_file}: {exc}") from None
    from .regressions import AcceptedError, accepted_between

    try:
        accepted = accepted_between(ROOT, a, b)
    except AcceptedError as exc:
        raise Refusal(str(exc)) from None
    rows = compare(a_res, b_res, benchmarks, args.factor, args.bench, accepted)
    cases = failed_cases(a_res, b_res) if re.search(args.bench, f"{BENCH}.QuickCases.track_error") else []
    ab = load_ab(args.ab) if args.ab else None
    from .regressions import commit_url

    info = {**machine_info(args.results, machine, used_b), "kernels_changed": kernels_changed(a, b), "notes": notes,
            "commit_url": commit_url(ROOT), "site_url": site_url(),
            "clocks": (clocks_of(a_res, args.bench), clocks_of(b_res, args.bench))}
    text, code = markdown(rows, a, b, machine, args.factor, args.only_changed, cases, ab, info)
    if args.json:
        print(json.dumps({"before": a, "after": b, "machine": machine, "factor": args.factor, "exit": code,
                          "results_of": {"before": used_a, "after": used_b}, "notes": notes,
                          "rule": "paired" if ab is not None else "asv", "verdict": text.splitlines()[0],
                          "failed_cases": cases, "rows": [asdict(r) | {"case": r.case} for r in rows],
                          "ab": ab}, indent=1))
    else:
        print(text, end="")
    return code
