"""How far one commit's series move between machine starts: raw time against the drift-free series.

    python -m verify_attn spread RESULT.json RESULT.json ... [--min-ms 0.02] [--json FILE]

Each file is asv's result file of the same commit recorded in another start of a machine (or on
another host of the GPU kind); the table gives, per point and implementation, the spread
max/min - 1 of the medians of ``track_time`` and of ``track_time_vs_anchor`` over the files that
hold the point (at least two: a run with `-b` holds only the classes it ran; the runs column and
the summary lines say where fewer than all the files do), the median x anchor itself (how far
the kernel has moved from its twin), and the largest of each per class, then per kernel over
the judged points outside Quick: how many, the largest and median spread, how many beyond 1%
and 2%. The goal the history is held to: the drift-free spread within 1%
at every Quick point and within 2% at every point of 20 us or more, for the series that judge
(the kernels under test; not the peers nor what benchmarks/accepted.json takes off for good):
the last lines say whether it is met and where not, which file reads the point highest and
which lowest, and the exit code is 1 where it is not. A refusal exits 2, one line: a file that is
missing or not asv's result file, files of different commits, or one run given twice (the same
path, or files with the same contents, a .json.gz of a .json too: a run against itself spreads by
nothing and would meet any goal). Per file, over the judged points it holds:
how far its drift-free values sit from each point's median over the files, on average and at
most, so a start that reads a few points high stands apart from the scatter of all of them.
A line sets the points whose kernel runs within 3% of its twin's time against those farther
off: the pair of a changed kernel and the anchor's is two kernels, which a start moves apart.
"""

from __future__ import annotations

import gzip
import json
import statistics
import tempfile
from pathlib import Path

from .cli import Refusal, parser, refusing
from .report import ANCHOR, BENCH, counts, not_judged, points, series_name

SERIES = ("track_time", "track_time_vs_anchor")
GOALS = (("Quick", 0.01), (None, 0.02))  # (class or None for every point of min_ms or more, largest spread)


def load(path: Path):
    """One asv result file, or one gzipped (.json.gz: the extra starts kept in
    results/<machine>/starts/), as asv's Results."""
    from asv import results as asv_results, util

    if not path.is_file():
        raise Refusal(f"{path}: no such file")
    try:
        if path.suffix == ".gz":
            with tempfile.TemporaryDirectory() as tmp:
                plain = Path(tmp) / path.stem
                plain.write_bytes(gzip.decompress(path.read_bytes()))
                return asv_results.Results.load(str(plain))
        return asv_results.Results.load(str(path))
    except (util.UserError, OSError, ValueError, KeyError, EOFError) as exc:
        raise Refusal(f"{path}: not an asv result file ({exc})") from None


def medians(path: Path) -> tuple[str, dict]:
    """(commit, {(class, params, series): median}) of one result file (load)."""
    res = load(path)
    out = {}
    for key in res.get_all_result_keys():
        cls, _, series = key.removeprefix(f"{BENCH}.").rpartition(".")
        if not key.startswith(f"{BENCH}.") or series not in SERIES:
            continue
        for combo, (value, _, samples) in points(res, key).items():
            value = statistics.median(samples) if samples else value
            if value is not None and value == value:
                out[(cls, combo, series)] = value
    return res.commit_hash, out


def contents(path: Path):
    """A result file's JSON (a .json.gz unpacked), to tell one run given twice."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def twice(paths: list[Path]) -> str | None:
    """One line naming two of the files that are one run (the same file, or the same contents),
    else None. Called once every file has loaded, so each reads."""
    seen: dict = {}
    for path in paths:
        key = json.dumps(contents(path), sort_keys=True)
        if key in seen:
            same = "is given twice" if seen[key].resolve() == path.resolve() else f"and {path} hold the same run"
            return f"{seen[key]} {same}: give the result files of different machine starts"
        seen[key] = path
    return None


def spread(runs: list[dict], min_s: float) -> list[dict]:
    """One row per point measured in at least two runs: each series' max/min - 1 over the runs
    that have it (a start run with `-b` lacks the classes it left out), how many those are, the
    raw median (ms) and the median x anchor (level; the series' keys hold spreads)."""
    keys = {k for r in runs for k in r}
    rows = {}
    for cls, combo, series in sorted(keys, key=str):
        values = [r[(cls, combo, series)] for r in runs if (cls, combo, series) in r]
        if len(values) < 2:
            continue
        row = rows.setdefault((cls, combo), {})
        row[series] = max(values) / min(values) - 1
        if series == "track_time_vs_anchor":
            row["level"] = statistics.median(values)
        if series == "track_time":
            row["ms"], row["runs"] = statistics.median(values) * 1e3, len(values)
    return [{"class": cls, "point": " ".join(map(str, combo)), "combo": combo, **v} for (cls, combo), v in rows.items()
            if {*SERIES, "ms"} <= v.keys() and v["ms"] >= min_s * 1e3]


def fewer_runs(rows: list[dict], n: int | None) -> str:
    """Words for the rows measured in fewer than all n runs ('' if none or n is not given)."""
    few = sorted({r["runs"] for r in rows if n and r["runs"] < n})
    if not few:
        return ""
    span = str(few[0]) if len(few) == 1 else f"{few[0]}-{few[-1]}"
    return f" ({sum(r['runs'] < n for r in rows)} of them in {span} of {n} runs)"


def judged(rows: list[dict]) -> list[dict]:
    """The rows report and the regressions page judge: kernels under test, not the series
    accepted.json takes off for good."""
    unjudged = not_judged()
    return [r for r in rows if counts(r["combo"][-1])
            and not any(u.search(series_name(r["class"], ANCHOR, r["combo"])) for u in unjudged)]


def verdicts(rows: list[dict], min_ms: float, kept: list[dict] | None = None,
             runs: int | None = None) -> list[tuple[str, list[dict]]]:
    """Per goal: its words and the judged rows beyond it (kept: judged(rows), if already made;
    runs: how many files were given, so the words say which points fewer of them hold)."""
    mine_all = judged(rows) if kept is None else kept
    out = []
    for cls, limit in GOALS:
        mine = [r for r in mine_all if cls is None or r["class"] == cls]
        words = f"{cls} points" if cls else f"points of {min_ms:g} ms or more"
        out.append((f"x anchor within {100 * limit:g}% at each of the {len(mine)} judged {words}"
                    f"{fewer_runs(mine, runs)}",
                    [r for r in mine if r["track_time_vs_anchor"] > limit]))
    return out


def by_kernel(rows: list[dict], kept: list[dict] | None = None) -> list[str]:
    """Per kernel, over the judged points outside Quick: how many, the largest and the median
    spread x anchor, how many beyond 1% and 2%, the largest and the median raw spread."""
    grid = [r for r in (judged(rows) if kept is None else kept) if r["class"] != "Quick"]
    out = []
    for impl in sorted({r["combo"][-1] for r in grid}):
        a = [r["track_time_vs_anchor"] for r in grid if r["combo"][-1] == impl]
        raw = [r["track_time"] for r in grid if r["combo"][-1] == impl]
        out.append(f"# {impl}: {len(a)} grid points, x anchor largest {100 * max(a):.2f}%, median "
                   f"{100 * statistics.median(a):.2f}%, {sum(x > 0.01 for x in a)} over 1%, {sum(x > 0.02 for x in a)} "
                   f"over 2%; raw largest {100 * max(raw):.2f}%, median {100 * statistics.median(raw):.2f}%")
    return out


def twins(rows: list[dict], kept: list[dict] | None = None, near: float = 0.03) -> str:
    """One line: the judged points whose kernel runs within +-near of its anchor twin's time
    (the pair much the same code) against those farther off (the kernel changed since the
    anchor), each group's largest spread x anchor and how many miss a goal (verdicts). Two
    different kernels answer a machine start differently, so where the misses sit among the
    points farther off it is time to move the anchor."""
    mine = judged(rows) if kept is None else kept
    missed = {id(r) for _, beyond in verdicts(rows, 0, mine) for r in beyond}
    groups = ([r for r in mine if abs(r["level"] - 1) <= near], [r for r in mine if abs(r["level"] - 1) > near])
    words = [f"{len(g)} {w}" + (f", largest spread {100 * max(r['track_time_vs_anchor'] for r in g):.2f}%, "
                                f"{sum(id(r) in missed for r in g)} beyond their goal" if g else "")
             for g, w in zip(groups, (f"within {100 * near:g}% of their twin's time", "farther off"))]
    return f"# twins: {words[0]}; {words[1]}"


def deviations(runs: list[dict], kept: list[dict]) -> list[dict]:
    """Per run, over the judged rows (kept) it holds: {(class, combo): its x anchor median over
    the median of the runs that hold the point, minus 1}."""
    keys = [(row["class"], row["combo"], "track_time_vs_anchor") for row in kept]
    middle = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    return [{k[:2]: r[k] / middle[k] - 1 for k in keys if k in r} for r in runs]


def by_file(names: list[str], devs: list[dict], limit: float = 0.01) -> list[str]:
    """One line per file: how many judged points, the mean deviation, how many beyond +-limit,
    and the largest (deviations)."""
    out = []
    for name, d in zip(names, devs):
        if not d:
            out.append(f"# {name}: no judged point")
            continue
        (cls, combo), worst = max(d.items(), key=lambda kv: abs(kv[1]))
        out.append(f"# {name}: {len(d)} judged points, x anchor {100 * statistics.mean(d.values()):+.3f}% "
                   f"from their medians on average, {sum(abs(v) > limit for v in d.values())} beyond "
                   f"+-{100 * limit:g}%, most {100 * worst:+.2f}% at {cls} {' '.join(map(str, combo))}")
    return out


def ends(row: dict, names: list[str], devs: list[dict]) -> str:
    """Which file reads a point highest and which lowest, x anchor from its median."""
    key = (row["class"], row["combo"])
    held = [(d[key], n) for n, d in zip(names, devs) if key in d]
    (lo, lo_name), (hi, hi_name) = min(held), max(held)
    return f"high {hi_name} {100 * hi:+.2f}%, low {lo_name} {100 * lo:+.2f}%"


def main(argv=None) -> int:
    return refusing("spread", table, argv)  # 2, not the cli's 1: exit 1 means a goal not met


def table(argv) -> int:
    p = parser("spread", __doc__)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--min-ms", type=float, default=0.02, help="points whose median is under this are left out (default 0.02)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if len(args.files) < 2:
        p.error("give at least two result files of one commit")
    loaded = [medians(f) for f in args.files]
    commits = {c for c, _ in loaded}
    if len(commits) != 1:
        raise Refusal(f"the files hold different commits ({', '.join(sorted(c[:8] for c in commits))}): give one commit's")
    duplicate = twice(args.files)
    if duplicate:
        raise Refusal(duplicate)
    rows = spread([m for _, m in loaded], args.min_ms / 1e3)
    print(f"# {commits.pop()[:8]}, {len(loaded)} runs: spread = max/min - 1 of the medians, raw time and x anchor")
    n = len(loaded)
    print(f"{'class':12s} {'point':28s} {'ms':>9s} {'raw':>7s} {'anchor':>7s} {'x anchor':>8s} {'runs':>4s}")
    for r in rows:
        print(f"{r['class']:12s} {r['point']:28s} {r['ms']:9.4f} {100 * r['track_time']:6.2f}% "
              f"{100 * r['track_time_vs_anchor']:6.2f}% {r['level']:8.4f} {r['runs']:4d}")
    for cls in sorted({r["class"] for r in rows}):
        mine = [r for r in rows if r["class"] == cls]
        print(f"# {cls}: {len(mine)} points{fewer_runs(mine, n)}, largest spread raw "
              f"{100 * max(r['track_time'] for r in mine):.2f}%, x anchor {100 * max(r['track_time_vs_anchor'] for r in mine):.2f}%")
    kept = judged(rows)  # accepted.json read once
    for line in by_kernel(rows, kept):
        print(line)
    print(twins(rows, kept))
    names = [f.name for f in args.files]
    devs = deviations([m for _, m in loaded], kept)
    for line in by_file(names, devs):
        print(line)
    met = True
    for words, beyond in verdicts(rows, args.min_ms, kept, runs=n):
        met &= not beyond
        print(f"# goal, {words}: " + ("met" if not beyond else "NOT met at " + ", ".join(
            f"{r['class']} {r['point']} {100 * r['track_time_vs_anchor']:.2f}% (x anchor {r['level']:.3f}; "
            f"{ends(r, names, devs)})" for r in beyond)))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "combo"} for r in rows], indent=1))
    return 0 if met else 1
