"""Short calls timed again in fresh processes, and the drift-free value taken over processes.

A kernel and its anchor twin are two loaded copies of the code, and on the H200 their ratio
settles at a level of its own in each process: at heads 16, q_len 9, prefix 16,384 tc over
its twin (byte-identical machine code) read 0.971-1.020 over 14 processes on three H200s, with
two repeats inside one process within 0.6% of each other and tc against itself within 0.3%
(README, "The recorded history"). The levels of the processes of one machine start are as
independent as those of different starts (docs/process_levels.py over five starts of
854b079), so the way to a steady value is more processes, not more samples in one. Calls
under the limits below carry it the most. For such points of the kernels LIMITS names (tc with
its pinned paths, tc_mma among them, and naive) each repeat process whose limit the call is under
checks and times the kernel beside its twin again (verify_attn.measure.measure_case, the
same inputs), and ``pool`` makes the point's drift-free value the mean of the processes'
medians.

    python -m verify_attn.repeat OUT.pickle   # a worker (``Workers``): its points come on stdin
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Per kernel, one entry per repeat process: the median call time under which that process
# repeats a point of the kernel. Over five starts of 854b079 (three processes under 0.1 ms) the
# mean of the process medians held every grid point within 1.60% and Quick's within 1.03%, the
# largest at tc's 23-25 us calls (tc at heads 64, q_len 9, prefix 2,048 in Quick), whose
# processes settle at one of two levels about 2% apart: those get two processes more, the
# spread of a mean of independent levels falling as one over the root of their count. Over four
# starts of 88c800a naive's 115 us call (heads 64, q_len 33, prefix 0), one process, spread
# 2.63%: its 8 values scatter by +-4% inside the process, so more values, from two processes
# more. At 88c800a the repeats (61, 61, 26 and 26 points in four processes) took 43 s of a
# 314 s full suite on the H200.
LIMITS = {"cuda": {"tc": (1e-4, 1e-4, 3e-5, 3e-5), "naive": (3e-4, 3e-4)}, "cpu": {}}
# Quick too: its tc at heads 16, q_len 9, prefix 65,536 read 0.991, 1.006 and 0.996 x anchor
# on three starts of c6e38c3 with 48 samples in one process (16 in each of three now).
REPEATED = ("full", "chain", "quick")  # cold is not judged
# Quick's own processes (it is timed on its own, with its own workers): its goal is 1%, not 2%,
# and over five starts of eecdc16 two of its tc points missed it, heads 16, q_len 9, prefix
# 65,536 (a 68 us call, three processes: 1.49%) and heads 64, q_len 9, prefix 2,048 (22 us,
# five: 1.00%). Every tc call of Quick under 0.1 ms in nine processes: by the root of the
# count, 0.86% and 0.75%. Nine points of Quick (tc's five, tc_mma's four) at about 0.25 s a
# point and process: 20 s of ced6e38's full suite (72 repeats; estimated 12 s).
QUICK_LIMITS = {"cuda": {"tc": (1e-4,) * 8, "naive": LIMITS["cuda"]["naive"]}, "cpu": {}}
# Whose short calls: tc and its pinned paths (tc_mma among them), and naive. flash's held 0.9%
# over dbbc220's five starts in one process and 0.94% over 8ecc171's two; naive's prefix-0 calls
# (0.03 ms) 1.8% and 2.45% (Heads16, q_len 9), over the 2% goal.


def processes(limits: dict) -> int:
    """How many repeat processes these limits ({kernel: (limit, ...)}) take."""
    return max(map(len, limits.values()), default=0)


def short_points(results: dict, limits: dict, k: int) -> list[tuple]:
    """The (heads, q_len, prefix_len, impl) keys of the entries that repeat process k (from 0)
    times: timed, with a yardstick, at under the k-th limit of their kernel (limits, as in
    LIMITS; a pinned path goes with the kernel it is a variant of) a call."""
    from . import registry

    def limit(name: str) -> float:
        impl = registry.get(name)
        mine = limits.get(name, limits.get(impl.variant_of, ())) if impl.under_test else ()
        return mine[k] if k < len(mine) else 0.0

    return [key for key, e in results.items() if e.get("anchor") and e["median"] < limit(key[-1])]


class Workers:
    """The repeat processes of these limits (LIMITS), started ahead: each imports the suite and
    loads the libraries (CPU work, no CUDA context yet) while the first process measures, then
    waits on its stdin for the points to time, so a repeat costs its timings and not a Python,
    torch and library start-up (4.5-5 s a process on the H200's host). Used as a context
    manager: the processes no points reached are told so on leaving, and exit."""

    def __init__(self, limits: dict):
        self.limits = limits
        self.procs = []
        self.tmp = tempfile.TemporaryDirectory()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            for k in range(1, processes(limits) + 1):
                out = Path(self.tmp.name) / f"out{k}.pickle"
                proc = subprocess.Popen([sys.executable, "-m", "verify_attn.repeat", str(out)],
                                        stdin=subprocess.PIPE, env=env)
                self.procs.append((proc, out))
        except BaseException:  # the ones already started must not wait on stdin forever
            self.__exit__()
            raise

    def __len__(self) -> int:
        return len(self.procs)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        live = [proc for proc, _ in self.procs if proc.poll() is None]
        for proc in live:
            if proc.stdin.closed:  # it has its points: the block was left while it timed them
                proc.kill()
            else:
                self._send(proc, b"")  # no points: it exits
        for proc in live:  # all told first, then waited on, so none waits for another's turn
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.tmp.cleanup()

    @staticmethod
    def _send(proc, data: bytes) -> None:
        try:
            proc.stdin.write(data)
        except (BrokenPipeError, ValueError, OSError):  # it ended before its points came: its exit status says why
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def time(self, wanted: list[dict]) -> list[dict]:
        """Each process in turn times its part of wanted (one {variant: [key, ...]} a process,
        in order; an empty one lets the process go untimed); their results, in order."""
        extras = []
        for k, ((proc, out), mine) in enumerate(zip(self.procs, wanted, strict=True), 1):
            mine = {v: [list(key) for key in ks] for v, ks in mine.items() if ks}
            self._send(proc, json.dumps(mine).encode() if mine else b"")
            code = proc.wait()
            if code != 0 or (mine and not out.exists()):
                raise RuntimeError(f"repeat process {k} exited {code}")
            extras.append(pickle.loads(out.read_bytes()) if mine else {})
        return extras


def extend(measured: dict, workers: Workers) -> list[int]:
    """Time the short points of each variant's results ({variant: results}) again in the
    workers, each those under its limits, and pool them into those results (in place); returns
    how many points each worker timed."""
    wanted = [{v: short_points(results, workers.limits, k) for v, results in measured.items() if v in REPEATED}
              for k in range(len(workers))]
    counts = [sum(map(len, w.values())) for w in wanted]
    if not any(counts):
        return counts
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the workers allocate their own inputs
    for extra in workers.time(wanted):
        for v, entries in extra.items():
            pool(measured[v], entries)
    return counts


def pool(results: dict, extra: dict) -> None:
    """Add a repeat process's entries to the earlier processes': samples appended (the raw
    series' median is over all of them), dropped samples summed, and the drift-free values
    kept per process (``anchor_by_process``) and recorded level-free (``level_free``), so that
    asv's median of them is the mean of the processes' medians and its test still sees the
    scatter inside each process. A failed check there fails the point."""
    for key, e in extra.items():
        mine = results[key]
        if not e.get("ok", False):
            mine.update(ok=False, reason=f"failed in a repeat process: {e.get('reason') or e.get('skipped')}")
            continue
        mine["samples"] = mine["samples"] + e["samples"]
        mine["median"] = statistics.median(mine["samples"])
        mine["dropped"] += e["dropped"]
        mine["processes"] = mine.get("processes", 1) + 1
        by_process = mine.get("anchor_by_process") or [mine["anchor"] or []]
        mine["anchor_by_process"] = [p for p in by_process + [e["anchor"] or []] if p]
        mine["anchor"] = level_free(mine["anchor_by_process"])


def level_free(by_process: list[list[float]]) -> list[float]:
    """The values of each process times the mean of the processes' medians over its own: every
    process's median becomes that mean, and so (each process giving as many values) does the
    median of them all; the scatter inside a process stays as measured."""
    medians = [statistics.median(p) for p in by_process]
    level = statistics.mean(medians)
    return [v * level / m for p, m in zip(by_process, medians) for v in p]


def measure(variant: str, keys: list[tuple]) -> dict:
    """The worker's side: the keys' kernels checked and timed beside their twins by the suite's
    own measure_grid (its timer, seed and selection), those points and kernels only."""
    from . import suite

    only = {}
    for h, q_len, prefix, impl in keys:
        only.setdefault((h, q_len, prefix), []).append(impl)
    return suite.measure_grid(None, variant, only=only)["results"]


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    from . import ops, suite

    ops.load()         # the libraries, while the first process still measures
    suite.anchored()
    wanted = json.loads(sys.stdin.read() or "{}")  # blocks until the points come ({}: none)
    if wanted:
        out.write_bytes(pickle.dumps({v: measure(v, [tuple(k) for k in ks]) for v, ks in wanted.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
