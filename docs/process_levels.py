"""How a repeated point's drift-free value would spread over machine starts under other
statistics of its processes, read back from recorded result files (no GPU).

    python docs/process_levels.py FILE... [--point CLASS H Q P IMPL]   # from the repository root

FILEs are result files of one commit on several machine starts (as for `python -m
verify_attn spread`: .json or .json.gz), recorded before the suite took the mean of the
process medians (verify_attn.repeat.level_free; 854b079's are). Then verify_attn.repeat.pool
appended each repeat process's drift-free values after the first process's, and on the H200
every process gives PER_PROCESS of them (16 timer samples, paired into rounds by
measure.paired_ratios), so a point with k x PER_PROCESS values came from k processes (not so
before 8ecc171: Quick then kept 24 values of one process, which this reads as three). Files
recorded since hold each process's values scaled to one median: their levels no longer show.
Per judged point (the kernels under test as report counts them; median time of 20 us or
more; in at least two files) each statistic's spread over the files is max/min - 1, as
`spread` takes it for the recorded one:
  pooled        the median of all values (what the suite records)
  mean          the mean of the per-process medians
  median        the median of the per-process medians
Also printed: how far the start-to-start variance of the mean of a start's processes is from
what independent processes would give (1.0: no level shared by a start's processes), and the
first process's offset from the workers'. --point prints one point's per-process medians.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_attn_tools.report import counts, points  # noqa: E402
from verify_attn_tools.spread import load  # noqa: E402

PER_PROCESS = 8
BENCH = "bench_verify_attn"
STATISTICS = {
    "pooled": lambda values, procs: statistics.median(values),
    "mean": lambda values, procs: statistics.mean(map(statistics.median, procs)),
    "median": lambda values, procs: statistics.median(map(statistics.median, procs)),
}


def series(path: Path) -> dict:
    """{(class, params): (median seconds, drift-free values)} of the judged kernels."""
    res = load(path)
    out = {}
    for key in res.get_all_result_keys():
        if not (key.startswith(f"{BENCH}.") and key.endswith(".track_time_vs_anchor")):
            continue
        cls = key.split(".")[1]
        times = points(res, key.replace("_vs_anchor", ""))
        for combo, (_, _, values) in points(res, key).items():
            if counts(combo[-1]) and values and combo in times and times[combo][0]:
                out[(cls, combo)] = (times[combo][0], values)
    return out


def processes(values: list) -> list[list]:
    n = len(values)
    k = n // PER_PROCESS if n % PER_PROCESS == 0 and n > PER_PROCESS else 1
    return [values[i * n // k:(i + 1) * n // k] for i in range(k)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--point", nargs=5, metavar=("CLASS", "H", "Q", "P", "IMPL"))
    ap.add_argument("--min-ms", type=float, default=0.02)
    args = ap.parse_args(argv)
    runs = [series(f) for f in args.files]
    if args.point:
        cls, *nums, impl = args.point
        want = (cls, tuple(int(x) for x in nums if x != "-") + (impl,))
        for f, run in zip(args.files, runs):
            entry = next((v for (c, combo), v in run.items() if (c, combo[-len(want[1]):]) == want
                          and len(combo) == len(want[1])), None)
            meds = [f"{statistics.median(p):.4f}" for p in processes(entry[1])] if entry else ["-"]
            print(f"{f.name}: {' '.join(meds)}")
        return 0
    keys = set().union(*runs)
    spreads = {s: {} for s in STATISTICS}
    variance, first = [], []
    for key in keys:
        held = [run[key] for run in runs if key in run]
        if len(held) < 2 or statistics.median(t for t, _ in held) * 1e3 < args.min_ms:
            continue
        for name, stat in STATISTICS.items():
            vals = [stat(v, processes(v)) for _, v in held]
            spreads[name][key] = max(vals) / min(vals) - 1
        procs = [[statistics.median(p) for p in processes(v)] for _, v in held]
        if len(held) >= 3 and all(len(p) >= 3 for p in procs):
            within = statistics.mean(statistics.variance(p) for p in procs) / len(procs[0])
            if within > 0:
                variance.append(statistics.variance([statistics.mean(p) for p in procs]) / within)
            first.append(statistics.mean((p[0] - statistics.mean(p[1:])) / statistics.mean(p) for p in procs))
    print(f"{len(spreads['pooled'])} judged points of {args.min_ms} ms or more in at least two files")
    print("statistic  Quick largest  grid largest  grid over 1% / 2%  repeated points largest")
    for name, by_key in spreads.items():
        quick = [v for (cls, _), v in by_key.items() if cls == "Quick"]
        grid = [v for (cls, _), v in by_key.items() if cls != "Quick"]
        rep = [v for key, v in by_key.items() if len(processes(runs[0].get(key, (0, []))[1])) > 1]
        print(f"{name:9s}  {max(quick, default=0):13.2%}  {max(grid, default=0):12.2%}  "
              f"{sum(v > 0.01 for v in grid):8d} / {sum(v > 0.02 for v in grid):<5d}  {max(rep, default=0):.2%}")
    if variance:
        q = statistics.quantiles(variance, n=4)
        print(f"{len(variance)} repeated points in 3+ files: var(start mean) / var(independent mean) median "
              f"{statistics.median(variance):.2f} (quartiles {q[0]:.2f}-{q[2]:.2f}); first process - workers: "
              f"median {statistics.median(first):+.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
