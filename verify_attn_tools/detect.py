"""Detection power: how often the pull-request check flags a planted slowdown, and a no-op.

    python -m verify_attn detect --sizes 0x20 2x10 3x10 2@8,16x10 3@8,16x10 [--gpus 0,1]
    python -m verify_attn detect --check continuous --machine M --sizes 0 3 5 10 --repeats 3

In a throwaway clone (never main), each size S gets a branch whose one commit makes the
flash kernel S% slower at the given head counts (default 64; --heads 8 16 plants where Quick
has fewer points), the output unchanged; size 0 is a comment-only change to the same file.
On a GPU the plant is in kernels/flash.cu, on the CPU in flash's CPU twin (kernels/cpu.cpp).
--plant time (the default) makes every block of the split kernel (on the CPU every split
task) spin at its end until it has taken (100 + S)% of its own time, so the kernel is about S%
slower whatever bounds it (on the H200 the guard's clock reads add about 1%: read the measured
ratios); --plant work (GPU) adds S% more key tiles, fully masked, which read no memory and so
cost less than S% where the kernel is memory- or latency-bound (at heads 8 and 16 a 2% work
plant measured 1.00-1.01).
A size may name its head counts and its runs: ``2@8,16x10`` is 2% at heads 8 and 16, ten runs.

--check picks the check a run is:
  ab          (default) `python -m verify_attn ab BASE -f FACTOR` with the size's branch checked
              out: both kernels in one fresh process, paired (verify_attn_tools/ab.py);
              flagged when it exits 1.
  continuous  `asv continuous -f FACTOR -b Quick` on the Quick timings; flagged on exit 1.
  paired      in each round the base is run once (`asv run`) and every size due in that round
              is run and compared with it (`asv compare -f FACTOR`, the table and rule
              continuous prints), flagged when a Quick timing got significantly worse: a third
              less GPU time than continuous.
Rounds (every size once, then again) are dealt out to the GPUs, one clone each.
Every command runs in a process group of its own; interrupted (Ctrl-C, SIGTERM), detect ends
them all and removes its clones.
``--find`` also builds a chain of 9 commits with the 10% slowdown in the middle and checks
that ``asv find`` names it. Prints the table; --json writes it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verify_attn import grid, suite

from . import ROOT
from .cli import parser
from .children import Children, cleanup

# Where each plant goes: the top of flash's split kernel (time), its key loop (work), the top
# of a split task of its CPU twin (time).
BLOCK = "  __shared__ FlashSmem sm;\n"
LOOP = "for (int t0 = key_begin; t0 < key_end; t0 += kTileKeys) {"
CPU_TASK = "parallel_for(int64_t(p.batch) * p.heads * splits, [&](int64_t task) {\n"
BENCH = r"Quick\.track_time(?!_)"
# A Quick.track_time row of `asv compare`: the mark, the ratio, then (heads, q_len, prefix_len, impl).
ROW = re.compile(r"^\|?\s*([+\-x!~]?)\s*\|?.*?\s(~?[\d.]+|n/a)\s*\|?\s*bench_verify_attn\.Quick\.track_time"
                 r"\((\d+), (\d+), (\d+), '(\w+)'\)")
LOG: Path | None = None  # --log: every asv command's output, as it runs
KIDS: Children | None = None  # main's: every command runs in a process group of its own, ended on an interrupt
AB = [sys.executable, "-m", "verify_attn", "ab"]  # a run of --check ab


# The time plant: a guard whose destructor, at the end of every block of the split kernel,
# spins until the block has taken (100 + pct)% of its own time. (A guard on every key-loop
# iteration measured 1.05-1.06 on the H200 for 2% and 3% alike: two clock reads an iteration
# cost more than the spin.)
SPIN = """
struct DetectPlant {  // planted by verify_attn_tools/detect.py
  long long c0;
  int pct;
  __device__ DetectPlant(long long start, int p) : c0(start), pct(p) {}
  __device__ ~DetectPlant() {
    const long long d = clock64() - c0;
    while (pct > 0 && clock64() - c0 < d + d * pct / 100) {
    }
  }
};
"""

CPU_SPIN = """
#include <chrono>
struct DetectPlant {  // planted by verify_attn_tools/detect.py
  std::chrono::steady_clock::time_point t0;
  int pct;
  explicit DetectPlant(int p) : t0(std::chrono::steady_clock::now()), pct(p) {}
  ~DetectPlant() {
    const auto d = std::chrono::steady_clock::now() - t0;
    while (pct > 0 && std::chrono::steady_clock::now() - t0 < d + d * pct / 100) {
    }
  }
};
"""


def planted(pct: int, heads=(64,), plant: str = "time", cpu: bool = False) -> tuple[str, str]:
    """(anchor, what replaces it) for a pct% plant at these head counts."""
    at = " || ".join(f"p.heads == {h}" for h in heads)
    mark = f"  // planted {pct}%"
    if cpu:
        return CPU_TASK, f"{CPU_TASK}    DetectPlant detect_plant({at} ? {pct} : 0);{mark}\n"
    if plant == "time":
        return BLOCK, f"{BLOCK}  DetectPlant detect_plant(clock64(), {at} ? {pct} : 0);{mark}\n"
    extra = f"({at} ? (key_end - key_begin) * {pct} / 100 : 0)"
    return LOOP, f"for (int t0 = key_begin; t0 < key_end + {extra}; t0 += kTileKeys) {{{mark}"


def ratios(table: str) -> dict[str, dict]:
    """{"flash h64 q9 p2048": {"ratio": "1.05", "mark": "+"}} from `asv compare`'s table."""
    out = {}
    for line in table.splitlines():
        m = ROW.search(line)
        if m and m[2] != "n/a":
            out[f"{m[6]} h{m[3]} q{m[4]} p{m[5]}"] = {"ratio": m[2], "mark": m[1]}
    return out


@dataclasses.dataclass(frozen=True)
class Variant:
    """A planted change: pct% slower at these head counts (pct 0: a comment only), run `runs` times."""

    pct: int
    heads: tuple[int, ...]
    runs: int

    @property
    def label(self) -> str:
        return f"{self.pct}%" + (f" at heads {'/'.join(map(str, self.heads))}" if self.pct else " (no-op)")

    @property
    def branch(self) -> str:
        return f"plant-{self.pct}" + (f"-h{'-'.join(map(str, self.heads))}" if self.pct else "")


def variant(spec: str, heads=(64,), repeats: int = 3) -> Variant:
    """PCT[@H,H..][xRUNS], e.g. 3, 2@8,16, 0x20 (heads and runs default to --heads, --repeats)."""
    m = re.fullmatch(r"(\d+)(?:@(\d+(?:,\d+)*))?(?:x(\d+))?", spec)
    if not m:
        raise ValueError(f"--sizes: {spec!r} is not PCT[@HEADS][xRUNS] (e.g. 2@8,16x10)")
    at = tuple(int(h) for h in m[2].split(",")) if m[2] else tuple(heads)
    wrong = [h for h in at if h not in grid.HEADS]
    if wrong:
        raise ValueError(f"--sizes: {spec!r} plants at heads {wrong}, not in the grid's {grid.HEADS}")
    pct = int(m[1])
    return Variant(pct, at if pct else (), int(m[3]) if m[3] else repeats)


def rounds(variants: list[Variant]) -> list[list[Variant]]:
    """Round r holds every variant with more than r runs."""
    return [[v for v in variants if v.runs > r] for r in range(max(v.runs for v in variants))]


def sh(cmd, cwd, env=None, check=True):
    proc = (KIDS.run(cmd, cwd, env) if KIDS else
            subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True))
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def git_commit(repo: Path, message: str) -> str:
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=detect", "-c", "user.email=detect@localhost", "commit", "-qm", message], repo)
    return sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()


def edit_flash(repo: Path, pct: int | None, note: str, heads=(64,), plant: str = "time", cpu: bool = False) -> None:
    """Plant pct% in flash (cpu: in its CPU twin); pct None or 0: a comment in flash.cu only."""
    path = repo / "kernels" / ("cpu.cpp" if cpu and pct else "flash.cu")
    text = path.read_text()
    if pct:
        anchor, replacement = planted(pct, heads, plant, cpu)
        assert text.count(anchor) == 1, f"the plant's anchor in {path.name} moved: update verify_attn_tools/detect.py"
        text = text.replace(anchor, replacement)
        if plant == "time" or cpu:
            last = text.rindex("#include")
            end = text.index("\n", last) + 1
            text = text[:end] + (CPU_SPIN if cpu else SPIN) + text[end:]
    path.write_text(text + f"// {note}\n")


def make_clone(workdir: Path, name: str, variants: list[Variant], plant: str, cpu: bool) -> tuple[Path, str, dict]:
    """A clone with a branch per variant off the current HEAD."""
    repo = workdir / name
    sh(["git", "clone", "-q", str(ROOT), str(repo)], workdir)
    base = sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()
    branches = {}
    for v in variants:
        sh(["git", "checkout", "-q", "-B", v.branch, base], repo)
        edit_flash(repo, v.pct, f"plant {v.label}" if v.pct else "a comment: changes nothing", v.heads or (64,),
                   plant, cpu)
        branches[v] = git_commit(repo, f"plant {v.label}")
    sh(["git", "checkout", "-q", base], repo)
    return repo, base, branches


def stream(repo: Path, env: dict, cmd: list[str], tag: str, check=True):
    if LOG is None:
        return sh(cmd, repo, env, check)
    # Streamed into the log line by line, so a run cut short still shows how far it got.
    t0, lines = time.perf_counter(), []
    start = KIDS.popen if KIDS else subprocess.Popen
    with start(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
               text=True) as proc, LOG.open("a") as log:
        for line in proc.stdout:
            lines.append(line)
            log.write(f"[{repo.name} {tag} {time.perf_counter() - t0:6.1f} s] {line}")
            log.flush()
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{''.join(lines)[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")


def asv(repo: Path, env: dict, *args, check=True):
    return stream(repo, env, [sys.executable, "-m", "asv", *args], args[0], check)


def ab_cases(rows: list[dict]) -> dict[str, dict]:
    """ab's JSON rows in the form ratios() reads from asv compare."""
    marks = {"slower": "+", "faster": "-", "failed": "!"}
    return {f"{r['impl']} {r['point']}": {"ratio": "n/a" if r["ratio"] is None else f"{r['ratio']:.4f}",
                                          "mark": marks.get(r["status"], "")} for r in rows}


def record(v: Variant, rep: int, exit_code: int, flagged: bool, t0: float, cases: dict, log: str) -> dict:
    out = {"pct": v.pct, "heads": list(v.heads), "variant": v.label, "repeat": rep, "exit": exit_code,
           "flagged": flagged, "seconds": round(time.perf_counter() - t0, 1), "cases": cases,
           "log_tail": log[-800:]}
    print(json.dumps(out), flush=True)
    return out


def run_shard(workdir: Path, gpu: str | None, jobs: list[tuple[int, list[Variant]]], variants: list[Variant],
              factor: float, machine: str | None, plant: str, check: str, cpu: bool) -> list[dict]:
    """jobs: (round, the variants due in it). ab: one fresh `verify_attn ab` process a run, the
    variant checked out. continuous: one `asv continuous` a run. paired: the base run once a
    round, then each variant run and compared with it."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    repo, base, branches = make_clone(workdir, f"clone-{gpu}", variants, plant, cpu)
    f = ["--machine", machine, "-f", str(factor)]
    out = []
    for rep, due in jobs:
        if check == "paired":
            asv(repo, env, "run", "--machine", machine, "--record-samples", "-b", BENCH, f"{base}^!")
        for v in due:
            t0 = time.perf_counter()
            if check == "ab":
                sh(["git", "checkout", "-q", branches[v]], repo)
                result = workdir / f"{repo.name}.ab.json"
                result.unlink(missing_ok=True)
                proc = stream(repo, env, [*AB, base, "-f", str(factor), "--json", str(result)], "ab", check=False)
                if proc.returncode not in (0, 1):
                    raise RuntimeError(f"ab exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
                rows = json.loads(result.read_text())["rows"]
                out.append(record(v, rep, proc.returncode, proc.returncode == 1, t0, ab_cases(rows),
                                  proc.stdout + proc.stderr))
            elif check == "paired":
                run = asv(repo, env, "run", "--machine", machine, "--record-samples", "-b", BENCH,
                          f"{branches[v]}^!", check=False)
                table = asv(repo, env, "compare", *f, base, branches[v]).stdout
                worse = any(c["mark"] == "+" for c in ratios(table).values())  # a failed run shows in its exit
                code = run.returncode or int(worse)
                out.append(record(v, rep, code, worse, t0, ratios(table), run.stdout + run.stderr))
            else:
                proc = asv(repo, env, "continuous", *f, "-b", BENCH, base, branches[v], check=False)
                table = asv(repo, env, "compare", *f, base, branches[v]).stdout
                out.append(record(v, rep, proc.returncode, proc.returncode == 1, t0, ratios(table),
                                  proc.stdout + proc.stderr))
    return out


def run_find(workdir: Path, machine: str, gpu: str | None, heads, plant: str, cpu: bool) -> dict:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    repo = workdir / "find"
    sh(["git", "clone", "-q", str(ROOT), str(repo)], workdir)
    commits = [sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()]
    for k in range(1, 10):
        edit_flash(repo, 10 if k == 5 else None, f"commit {k}", heads, plant, cpu)
        commits.append(git_commit(repo, f"commit {k}" + (" (planted 10%)" if k == 5 else "")))
    t0 = time.perf_counter()
    # asv find ignores asv.conf.json's launch_method and would spawn a fresh interpreter (a
    # torch import) for each of the benchmark's parameter points at every bisection step.
    proc = asv(repo, env, "find", "--launch-method", "forkserver", "--machine", machine, f"{commits[0]}..{commits[-1]}",
               "bench_verify_attn.Quick.track_time", check=False)
    found = re.findall(r"Greatest regression found: (\w+)", proc.stdout)
    return {"range": len(commits) - 1, "planted": commits[5][:8], "found": found[0][:8] if found else None,
            "seconds": round(time.perf_counter() - t0, 1), "exit": proc.returncode,
            "log_tail": (proc.stdout + proc.stderr)[-1500:]}


def main(argv=None) -> int:
    p = parser("detect", __doc__)
    p.add_argument("--sizes", nargs="+", default=["0", "3", "5", "10"],
                   help="planted slowdowns in %%, each PCT[@HEADS][xRUNS] (e.g. 0x20 2@8,16x10)")
    p.add_argument("--repeats", type=int, default=3, help="runs of a size that names none")
    p.add_argument("--check", default="ab", choices=["ab", "continuous", "paired"],
                   help="what a run is: ab (default), asv continuous, or asv run + compare against a base run once a round")
    p.add_argument("--factor", type=float, default=None, help="default: ab's 1.01, asv's 1.03")
    p.add_argument("--heads", nargs="+", type=int, default=None, choices=grid.HEADS,
                   help="the head counts a size that names none is planted at (default 64 on a GPU; on the CPU "
                        "those its Quick times)")
    p.add_argument("--plant", default="time", choices=["time", "work"],
                   help="time: each key-loop iteration spins S%% longer (default); work: S%% more (masked) key tiles")
    p.add_argument("--gpus", default=None, help="comma-separated GPU ids, one shard each")
    p.add_argument("--machine", help="asv machine name, for --check continuous/paired and --find")
    p.add_argument("--find", action="store_true", help="also bisect a planted slowdown with asv find")
    p.add_argument("--json", type=Path)
    p.add_argument("--log", type=Path, help="append every command's output here as it runs")
    args = p.parse_args(argv)
    cpu = suite.device() == "cpu"
    heads = args.heads or (sorted({pt[0] for pt in suite.selection("quick").points()}) if cpu else [64])
    try:
        variants = [variant(s, heads, args.repeats) for s in args.sizes]
    except ValueError as exc:
        p.error(str(exc))
    if (args.check != "ab" or args.find) and not args.machine:
        p.error("--machine is needed for asv (--check continuous/paired, --find)")
    if cpu and args.plant == "work":
        p.error("--plant work plants in the CUDA kernel; on the CPU the plant is time")
    factor = args.factor or (1.01 if args.check == "ab" else 1.03)
    global LOG
    LOG = args.log.resolve() if args.log else None
    gpus = args.gpus.split(",") if args.gpus else [None]
    jobs = list(enumerate(rounds(variants)))
    if args.check != "paired":  # spread single runs, not rounds
        jobs = [(rep, [v]) for rep, due in jobs for v in due]
    shards = [jobs[i::len(gpus)] for i in range(len(gpus))]
    global KIDS
    # Every command in a process group of its own: Ctrl-C or SIGTERM ends them all (asv, ab, the
    # builds) before the shards' threads are joined and the clones removed.
    try:
        with tempfile.TemporaryDirectory(prefix="verify_attn_detect_") as tmp, cleanup() as KIDS:
            workdir = Path(tmp)
            pool = concurrent.futures.ThreadPoolExecutor(len(gpus) + 1)
            try:
                futures = [pool.submit(run_shard, workdir, g, s, variants, factor, args.machine, args.plant,
                                       args.check, cpu) for g, s in zip(gpus, shards) if s]
                find = (pool.submit(run_find, workdir, args.machine, gpus[-1], heads, args.plant, cpu)
                        if args.find else None)
                runs = [r for f in futures for r in f.result()]
                found = find.result() if find else None
            finally:
                KIDS.end()
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        KIDS = None
    how = {"ab": "verify_attn ab (paired in one process)", "continuous": f"asv continuous -b '{BENCH}'",
           "paired": f"asv run + compare -b '{BENCH}', the base once a round"}[args.check]
    print(f"\n{how}, -f {factor}, {args.plant} plant in flash{' (CPU)' if cpu else ''}")
    print(f"{'planted':>22s} {'runs':>5s} {'flagged':>8s}   flash ratios (after/before) at the planted head counts: "
          "min median max")
    for v in variants:
        mine = [r for r in runs if r["variant"] == v.label]
        at = tuple(f"h{h} " for h in (v.heads or grid.HEADS))
        seen = sorted(float(x["ratio"].lstrip("~")) for r in mine for c, x in r["cases"].items()
                      if c.startswith("flash") and any(a in c for a in at) and x["ratio"] != "n/a")
        shown = f"{seen[0]:.4f} {seen[len(seen) // 2]:.4f} {seen[-1]:.4f} ({len(seen)} points)" if seen else "-"
        print(f"{v.label:>22s} {len(mine):5d} {sum(r['flagged'] for r in mine):8d}   {shown}")
    if found:
        print(f"\nasv find over {found['range']} commits: planted {found['planted']}, found {found['found']} "
              f"({found['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "find": found, "factor": factor, "plant": args.plant,
                                         "check": args.check, "device": "cpu" if cpu else "cuda",
                                         "sizes": args.sizes}, indent=1))
    return 0
