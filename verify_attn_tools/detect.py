"""Detection power: how often ``asv continuous`` flags a planted slowdown, and a no-op.

    python -m verify_attn detect --sizes 0 3 5 10 --repeats 3 --factor 1.03 [--heads 8 16] [--gpus 0,1]

In a throwaway clone (never main), each size S gets a branch whose one commit makes the
flash kernel S% slower at the given head counts (default 64; --heads 8 16 plants where Quick
has fewer points), the output unchanged; size 0 is a comment-only change to the same file.
--plant time (the default) makes every iteration of the key loop spin until it has taken
(100 + S)% of its own time, so the kernel is S% slower whatever bounds it; --plant work adds
S% more key tiles, fully masked, which read no memory and so cost less than S% where the
kernel is memory- or latency-bound (at heads 8 and 16 a 2% work plant measured 1.00-1.01). Every (size, repeat) runs ``asv continuous
-f FACTOR base branch`` on the Quick timings; a run is flagged when continuous exits 1.
``--find`` also builds a chain of 9 commits with the 10% slowdown in the middle and checks
that ``asv find`` names it. Prints the table; --json writes it.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verify_attn import grid

from . import ROOT
from .cli import parser

LOOP = "for (int t0 = key_begin; t0 < key_end; t0 += kTileKeys) {"
BENCH = r"Quick\.track_time(?!_)"
# A Quick.track_time row of `asv compare`: the mark, the ratio, then (heads, q_len, prefix_len, impl).
ROW = re.compile(r"^\|?\s*([+\-x!~]?)\s*\|?.*?\s(~?[\d.]+|n/a)\s*\|?\s*bench_verify_attn\.Quick\.track_time"
                 r"\((\d+), (\d+), (\d+), '(\w+)'\)")
LOG: Path | None = None  # --log: every asv command's output, as it runs


# The time plant: a guard whose destructor, at the end of every key-loop iteration, spins
# until the iteration has taken (100 + pct)% of its own time.
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


def planted_loop(pct: int, heads=(64,), plant: str = "time") -> str:
    at = " || ".join(f"p.heads == {h}" for h in heads)
    if plant == "time":
        return f"{LOOP}  DetectPlant detect_plant(clock64(), {at} ? {pct} : 0);  // planted {pct}%"
    extra = f"({at} ? (key_end - key_begin) * {pct} / 100 : 0)"
    return f"for (int t0 = key_begin; t0 < key_end + {extra}; t0 += kTileKeys) {{  // planted {pct}%"


def ratios(table: str) -> dict[str, dict]:
    """{"flash h64 q9 p2048": {"ratio": "1.05", "mark": "+"}} from `asv compare`'s table."""
    out = {}
    for line in table.splitlines():
        m = ROW.search(line)
        if m and m[2] != "n/a":
            out[f"{m[6]} h{m[3]} q{m[4]} p{m[5]}"] = {"ratio": m[2], "mark": m[1]}
    return out


def sh(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def git_commit(repo: Path, message: str) -> str:
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=detect", "-c", "user.email=detect@localhost", "commit", "-qm", message], repo)
    return sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()


def edit_flash(repo: Path, pct: int | None, note: str, heads=(64,), plant: str = "time") -> None:
    path = repo / "kernels" / "flash.cu"
    text = path.read_text()
    if pct:
        assert LOOP in text, "the flash kernel's key loop moved: update verify_attn_tools/detect.py"
        text = text.replace(LOOP, planted_loop(pct, heads, plant))
        if plant == "time":
            last = text.rindex("#include")
            end = text.index("\n", last) + 1
            text = text[:end] + SPIN + text[end:]
    path.write_text(text + f"// {note}\n")


def make_clone(workdir: Path, name: str, sizes: list[int], heads, plant: str) -> tuple[Path, str, dict[int, str]]:
    """A clone with a branch per size off the current HEAD."""
    repo = workdir / name
    sh(["git", "clone", "-q", str(ROOT), str(repo)], workdir)
    base = sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()
    branches = {}
    for pct in sizes:
        sh(["git", "checkout", "-q", "-B", f"plant-{pct}", base], repo)
        edit_flash(repo, pct, f"plant {pct}%" if pct else "a comment: changes nothing", heads, plant)
        branches[pct] = git_commit(repo, f"plant {pct}%")
    sh(["git", "checkout", "-q", base], repo)
    return repo, base, branches


def asv(repo: Path, env: dict, *args, check=True):
    cmd = [sys.executable, "-m", "asv", *args]
    if LOG is None:
        return sh(cmd, repo, env, check)
    # Streamed into the log line by line, so a run cut short still shows how far it got.
    t0, lines = time.perf_counter(), []
    with subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc, LOG.open("a") as log:
        for line in proc.stdout:
            lines.append(line)
            log.write(f"[{repo.name} {args[0]} {time.perf_counter() - t0:6.1f} s] {line}")
            log.flush()
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{''.join(lines)[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")


def run_shard(workdir: Path, gpu: str | None, jobs: list[tuple[int, int]], sizes: list[int], factor: float,
              machine: str, heads, plant: str) -> list[dict]:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    repo, base, branches = make_clone(workdir, f"clone-{gpu}", sizes, heads, plant)
    out = []
    for pct, rep in jobs:
        t0 = time.perf_counter()
        proc = asv(repo, env, "continuous", "--machine", machine, "-f", str(factor), "-b", BENCH, base,
                   branches[pct], check=False)
        table = asv(repo, env, "compare", "--machine", machine, "-f", str(factor), base, branches[pct]).stdout
        out.append({"pct": pct, "repeat": rep, "exit": proc.returncode, "flagged": proc.returncode == 1,
                    "seconds": round(time.perf_counter() - t0, 1), "cases": ratios(table),
                    "log_tail": (proc.stdout + proc.stderr)[-800:]})
        print(json.dumps(out[-1]), flush=True)
    return out


def run_find(workdir: Path, machine: str, gpu: str | None, heads, plant: str) -> dict:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    repo = workdir / "find"
    sh(["git", "clone", "-q", str(ROOT), str(repo)], workdir)
    commits = [sh(["git", "rev-parse", "HEAD"], repo).stdout.strip()]
    for k in range(1, 10):
        edit_flash(repo, 10 if k == 5 else None, f"commit {k}", heads, plant)
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
    p.add_argument("--sizes", nargs="+", type=int, default=[0, 3, 5, 10])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--factor", type=float, default=1.03)
    p.add_argument("--heads", nargs="+", type=int, default=[64], choices=grid.HEADS,
                   help="the head counts the slowdown is planted at (default 64)")
    p.add_argument("--plant", default="time", choices=["time", "work"],
                   help="time: each key-loop iteration spins S%% longer (default); work: S%% more (masked) key tiles")
    p.add_argument("--gpus", default=None, help="comma-separated GPU ids, one shard each")
    p.add_argument("--machine", required=True, help="asv machine name (asv machine --yes --machine NAME)")
    p.add_argument("--find", action="store_true", help="also bisect a planted slowdown with asv find")
    p.add_argument("--json", type=Path)
    p.add_argument("--log", type=Path, help="append every asv command's output here as it runs")
    args = p.parse_args(argv)
    global LOG
    LOG = args.log.resolve() if args.log else None
    gpus = args.gpus.split(",") if args.gpus else [None]
    jobs = [(pct, rep) for rep in range(args.repeats) for pct in args.sizes]
    shards = [jobs[i::len(gpus)] for i in range(len(gpus))]
    with tempfile.TemporaryDirectory(prefix="verify_attn_detect_") as tmp:
        workdir = Path(tmp)
        with concurrent.futures.ThreadPoolExecutor(len(gpus) + 1) as pool:
            futures = [pool.submit(run_shard, workdir, g, s, args.sizes, args.factor, args.machine, args.heads,
                                   args.plant)
                       for g, s in zip(gpus, shards)]
            find = pool.submit(run_find, workdir, args.machine, gpus[-1], args.heads, args.plant) if args.find else None
            runs = [r for f in futures for r in f.result()]
            found = find.result() if find else None
    planted = "/".join(map(str, args.heads))
    print(f"\nasv continuous -f {args.factor} -b '{BENCH}', {args.plant} slowdown planted in flash at heads {planted}")
    print(f"{'planted':>8s} {'runs':>5s} {'flagged':>8s}   flash ratios (after/before) per point")
    for pct in args.sizes:
        mine = [r for r in runs if r["pct"] == pct]
        shown = " ".join(f"{c}={v['ratio']}{v['mark']}" for r in mine for c, v in sorted(r["cases"].items())
                         if c.startswith("flash"))
        print(f"{pct:7d}% {len(mine):5d} {sum(r['flagged'] for r in mine):8d}   {shown}")
    if found:
        print(f"\nasv find over {found['range']} commits: planted {found['planted']}, found {found['found']} "
              f"({found['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "find": found, "factor": args.factor, "plant": args.plant,
                                         "heads": args.heads}, indent=1))
    return 0

