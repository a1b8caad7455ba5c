"""Short calls timed again in fresh processes, their samples pooled with the first process's.

A kernel and its anchor twin are two loaded copies of the code, and on the H200 their ratio
settles at a level of its own in each process: at heads 16, q_len 9, prefix 16,384 tc over
its twin (byte-identical machine code) read 0.971-1.020 over 14 processes on three H200s, with
two repeats inside one process within 0.6% of each other and tc against itself within 0.3%
(README, "The recorded history"). Calls under SHORT_CALL_S carry it the most: every judged
grid point whose drift-free series spread by more than 1% over five machine starts of dbbc220
was one. For such points of the KERNELS (tc with its pinned paths, tc_mma among them, and
naive) each of PROCESSES - 1 more processes checks and times the kernel
beside its twin again (verify_attn.measure.measure_case, the same inputs), so a point's median
pools the levels of PROCESSES processes rather than taking one.

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

SHORT_CALL_S = 1e-4
# Three processes: c6e38c3 over three machine starts held tc's drift-free series within 0.50%
# at Chain's 18 points and 0.31% at the Heads classes' 57 (one process, dbbc220's same starts:
# 2.5% and 2.9%); the repeats took 42 s of a 315 s full suite.
PROCESSES = {"cuda": 3, "cpu": 1}
# Quick too: its tc at heads 16, q_len 9, prefix 65,536 read 0.991, 1.006 and 0.996 x anchor
# on three starts of c6e38c3 with 48 samples in one process (16 in each of three now).
REPEATED = ("full", "chain", "quick")  # cold is not judged
# Whose short calls: tc and its pinned paths, and naive. flash's held 0.9% over dbbc220's five
# starts in one process and 0.94% over 8ecc171's two; naive's prefix-0 calls (0.03 ms) 1.8% and
# 2.45% (Heads16, q_len 9), over the 2% goal.
KERNELS = ("tc", "naive")


def short_points(results: dict) -> list[tuple]:
    """The (heads, q_len, prefix_len, impl) keys of KERNELS' entries that were timed, with a
    yardstick, at under SHORT_CALL_S a call."""
    from . import registry

    def repeated(name: str) -> bool:
        impl = registry.get(name)
        return impl.under_test and (name in KERNELS or impl.variant_of in KERNELS)

    return [key for key, e in results.items() if e.get("anchor") and repeated(key[-1]) and e["median"] < SHORT_CALL_S]


class Workers:
    """The processes - 1 repeat processes, started ahead: each imports the suite and loads the
    libraries (CPU work, no CUDA context yet) while the first process measures, then waits on
    its stdin for the points to time, so a repeat costs its timings and not a Python, torch and
    library start-up (4.5-5 s a process on the H200's host). Used as a context manager: the
    processes no points reached are told so on leaving, and exit."""

    def __init__(self, processes: int):
        self.procs = []
        self.tmp = tempfile.TemporaryDirectory()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            for k in range(1, processes):
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

    def time(self, wanted: dict) -> list[dict]:
        """Each process in turn times wanted ({variant: [key, ...]}); their results, in order."""
        data = json.dumps({v: [list(k) for k in ks] for v, ks in wanted.items()}).encode()
        extras = []
        for k, (proc, out) in enumerate(self.procs, 1):
            self._send(proc, data)
            code = proc.wait()
            if code != 0 or not out.exists():
                raise RuntimeError(f"repeat process {k} exited {code}")
            extras.append(pickle.loads(out.read_bytes()))
        return extras


def extend(measured: dict, workers: Workers) -> int:
    """Time the short points of each variant's results ({variant: results}) again in the
    workers and pool their samples into those results (in place); returns how many points
    were pooled."""
    keys = {v: short_points(results) for v, results in measured.items() if v in REPEATED}
    count = sum(map(len, keys.values()))
    if not len(workers) or not count:
        return 0
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the workers allocate their own inputs
    for extra in workers.time(keys):
        for v, entries in extra.items():
            pool(measured[v], entries)
    return count


def pool(results: dict, extra: dict) -> None:
    """Add a repeat process's entries to the first process's: samples and drift-free values
    appended, the median retaken, dropped samples summed; a failed check there fails the point."""
    for key, e in extra.items():
        mine = results[key]
        if not e.get("ok", False):
            mine.update(ok=False, reason=f"failed in a repeat process: {e.get('reason') or e.get('skipped')}")
            continue
        mine["samples"] = mine["samples"] + e["samples"]
        mine["anchor"] = (mine["anchor"] or []) + (e["anchor"] or [])
        mine["median"] = statistics.median(mine["samples"])
        mine["dropped"] += e["dropped"]
        mine["processes"] = mine.get("processes", 1) + 1


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
