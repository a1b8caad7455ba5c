"""Fill the history's holes (or the given commits) with asv, one shard per GPU.

Each shard runs in its own clone (its own asv environments, so builds never collide; the
extension's build cache is shared and locked) and its results are copied into this
checkout's results/<machine>/. With no commits, runs exactly those the history lists as
MISSING for this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from verify_attn import suite
from verify_attn.machine import asv_machine_name

from . import ROOT, history
from .cli import parser
from .run import register_machine


def main(argv=None) -> int:
    p = parser("backfill", __doc__)
    p.add_argument("gpus", help="comma-separated GPU ids, one shard each (e.g. 0,1)")
    p.add_argument("commits", nargs="*", help="default: the history's holes on this machine")
    args = p.parse_args(argv)
    gpus = args.gpus.split(",")
    machine = asv_machine_name(suite.device())
    commits = args.commits or [c.sha for c in history.commits(ROOT, machine) if c.missing]
    if not commits:
        print(f"no commits to run: the {machine} history has no holes")
        return 0
    print(f"backfilling {len(commits)} commits on GPUs {args.gpus} as {machine}", flush=True)
    register_machine(machine)
    status = 0
    with tempfile.TemporaryDirectory(prefix="verify_attn_backfill_") as tmp:
        procs = []
        for i, gpu in enumerate(gpus):
            mine = commits[i::len(gpus)]
            if not mine:
                continue
            clone = Path(tmp) / f"s{i}"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            hashes = Path(tmp) / f"hashes{i}"
            hashes.write_text("\n".join(mine) + "\n")
            log = open(Path(tmp) / f"log{i}", "w")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            procs.append((i, gpu, clone, log, subprocess.Popen(
                [sys.executable, "-m", "asv", "run", "--machine", machine, "--record-samples", f"HASHFILE:{hashes}"],
                cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)))
        out = ROOT / "results" / machine
        out.mkdir(parents=True, exist_ok=True)
        for i, gpu, clone, log, proc in procs:
            code = proc.wait()
            log.close()
            print(f"shard {i} (GPU {gpu}) exit {code}; log tail:\n" +
                  "".join(Path(log.name).read_text().splitlines(True)[-3:]), flush=True)
            status = status or code
            for path in (clone / "results" / machine).glob("*.json"):
                shutil.copyfile(path, out / path.name)
            if (clone / "results" / "benchmarks.json").exists():
                shutil.copyfile(clone / "results" / "benchmarks.json", ROOT / "results" / "benchmarks.json")
    return status
