"""Start the suite's builds together, each in a process of its own, before they are needed.

A measurement needs up to three libraries: the checkout's extension, the anchor's kernels
(verify_attn.anchor) and FlashMLA's decode (verify_attn.flashmla, about 100 s of one nvcc on
a cold cache); the resource benchmark needs nvcc's report of every kernel source
(verify_attn.resources, about 20 s of compiles). Done where first needed they run one after
the other inside the classes asv sets up; started here they run side by side while the GPU
is busy. Each builder holds a lock (verify_attn.build), so a measurement that needs a
library before it is done waits for it and then loads it; a builder that fails leaves
nothing behind, and the measurement's own load fails with the reason.

The builders are children in this process group: whatever ends a run (``python -m
verify_attn run`` ends its asv's group) ends them too.
"""

from __future__ import annotations

import os
import subprocess
import sys

WHAT = ("extension", "anchor", "flashmla", "resources")


def _pending(needs) -> list[str]:
    """What of needs is neither built nor being built (cheap: content keys and a lock test). A
    library a builder started earlier holds is left to it: a second builder would only wait on
    its lock, a Python and torch start-up beside the timings of the class that started it."""
    from . import anchor, build, flashmla, resources

    todo = []
    if "extension" in needs and not build.library_path().exists() and not build.busy(build._build_dir()):
        todo.append("extension")
    if "anchor" in needs and anchor.commit() != "off" and anchor.repository() is not None:
        try:
            lib = anchor.library()[0]
            if not lib.path().exists() and not build.busy(lib.build_dir()):
                todo.append("anchor")
        except Exception:  # an unknown revision: the measurement's load says why
            pass
    if ("flashmla" in needs and build.use_cuda() and flashmla.unavailable() is None
            and not flashmla.library().path().exists() and not build.busy(flashmla.library().build_dir())):
        todo.append("flashmla")
    if "resources" in needs:
        try:
            path = resources.cache_path()
            if not path.exists() and not build.busy(path.with_suffix("")):
                todo.append("resources")
        except Exception:  # no CUDA sources to report: the benchmark's own call says why
            pass
    return todo


def start(needs=WHAT, popen=subprocess.Popen) -> list[subprocess.Popen]:
    """Start a builder for each library of needs not built yet; returns them (not waited
    for). popen: how (a verb's tracked process groups: verify_attn_tools.children). Off with
    VERIFY_ATTN_PREBUILD=0."""
    if os.environ.get("VERIFY_ATTN_PREBUILD") == "0":
        return []
    from . import build

    log = build.cache_dir() / "prebuild.log"
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    procs = []
    for what in _pending(needs):
        with open(log, "a") as out:
            procs.append(popen([sys.executable, "-m", "verify_attn.prebuild", what],
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
    return procs


def main(what: str) -> int:
    from . import anchor, build, flashmla, resources

    if what == "extension":
        build.load()
    elif what == "anchor":
        anchor.load()
    elif what == "flashmla":
        flashmla.load()
    elif what == "resources":
        resources.report()
    else:
        print(f"verify_attn.prebuild: what to build must be one of {', '.join(WHAT)}, got {what!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
