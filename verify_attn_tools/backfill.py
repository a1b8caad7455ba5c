"""Fill the history's holes (or the given commits) with asv, one shard per GPU.

Each shard runs in its own clone (its own asv environments, so builds never collide; the
extension's build cache is shared and locked) and its results are copied into this
checkout's results/<machine>/. Every commit is measured by its own benchmark suite: the
shard checks the commit out before `asv run`, since the asv classes call into the measured
package of their own commit (a newer suite over an older package fails its setup). With no
commits, runs exactly those the history lists as MISSING for this machine. Interrupted
(Ctrl-C, SIGTERM), it ends the shards' process groups and removes the clones.

``--out DIR`` records a run of the given commits for `spread` instead (one machine start, or
one GPU of it): every shard runs every commit given, its result files go to DIR/gpu<id>/
beside the GPU's identity (nvidia-smi), each holding that run alone, and results/ stays as it is.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from verify_attn import suite
from verify_attn.machine import asv_machine_name

from . import ROOT, history
from .cli import parser
from .children import cleanup
from .run import register_machine


def shard_script(mine: list[str], machine: str, bench: str | None, fresh: bool = False) -> str:
    """The shell script a shard runs in its clone: each commit checked out, then asv on it
    (fresh: the commit's recorded file removed first, so the run's file holds it alone)."""
    asv = f"{shlex.quote(sys.executable)} -m asv run --machine {shlex.quote(machine)} --record-samples"
    if bench:
        asv += f" -b {shlex.quote(bench)}"
    drop = f"rm -f results/{shlex.quote(machine)}/${{sha:0:8}}-*.json && " if fresh else ""
    return ("status=0; for sha in " + " ".join(mine) + "; do git checkout -q --detach $sha && "
            f"{drop}{asv} $sha^! || status=1; done; exit $status")


def clone_head(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def identify(gpu: str, path: Path) -> None:
    """The GPU's UUID, name and clocks as nvidia-smi gives them (starts differ by the GPU)."""
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=uuid,name,clocks.sm,clocks.max.sm,clocks.mem,"
                               "temperature.gpu,power.draw,power.limit", "--format=csv"], capture_output=True, text=True)
        path.write_text(done.stdout or done.stderr)


def main(argv=None) -> int:
    p = parser("backfill", __doc__)
    p.add_argument("gpus", help="comma-separated GPU ids, one shard each (e.g. 0,1)")
    p.add_argument("commits", nargs="*", help="default: the history's holes on this machine")
    p.add_argument("-b", "--bench", help="only benchmarks matching this regex (asv -b)")
    p.add_argument("--out", type=Path, help="record into OUT/gpu<id>/ for spread, not into results/")
    args = p.parse_args(argv)
    if args.out and not args.commits:
        p.error("--out records the commits given: name them")
    gpus = args.gpus.split(",")
    machine = asv_machine_name(suite.device())
    commits = [subprocess.run(["git", "rev-parse", "--verify", f"{c}^{{commit}}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip() for c in args.commits]
    commits = commits or [c.sha for c in history.commits(ROOT, machine) if c.missing]
    if not commits:
        print(f"no commits to run: the {machine} history has no holes")
        return 0
    print(f"backfilling {len(commits)} commits on GPUs {args.gpus} as {machine}", flush=True)
    register_machine(machine)
    head = clone_head(ROOT)
    status = 0
    # The clones are removed and the shards' process groups (asv, its benchmark processes, the
    # builds) ended however this ends: done, failed, Ctrl-C or SIGTERM.
    with tempfile.TemporaryDirectory(prefix="verify_attn_backfill_") as tmp, cleanup() as kids:
        procs = []
        for i, gpu in enumerate(gpus):
            mine = commits if args.out else commits[i::len(gpus)]
            if not mine:
                continue
            clone = Path(tmp) / f"s{i}"
            kids.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            log = open(Path(tmp) / f"log{i}", "w")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            script = shard_script(mine, machine, args.bench, fresh=args.out is not None)
            procs.append((i, gpu, clone, mine, log, kids.popen(["bash", "-c", script], cwd=clone, env=env,
                                                               stdout=log, stderr=subprocess.STDOUT)))
        for i, gpu, clone, mine, log, proc in procs:
            out = args.out / f"gpu{gpu}" if args.out else ROOT / "results" / machine
            out.mkdir(parents=True, exist_ok=True)
            code = proc.wait()
            log.close()
            print(f"shard {i} (GPU {gpu}) exit {code}; log tail:\n" +
                  "".join(Path(log.name).read_text().splitlines(True)[-3:]), flush=True)
            status = status or code
            ran = {sha[:8] for sha in mine}  # a checked-out commit also holds older results files
            for path in (clone / "results" / machine).glob("*.json"):
                if path.name[:8] in ran:
                    shutil.copyfile(path, out / path.name)
            if args.out:
                identify(gpu, out / "gpu.txt")
                continue
            # The suite's description is that of the last commit the shard ran: kept only
            # when that is this checkout's HEAD, so an old suite never replaces today's.
            if clone_head(clone) == head and (clone / "results" / "benchmarks.json").exists():
                shutil.copyfile(clone / "results" / "benchmarks.json", ROOT / "results" / "benchmarks.json")
    return status
