"""The anchor: kernels/ at one pinned commit, the yardstick of every recorded timing.

Absolute times move 7-13% between starts of a lent GPU machine and about 2% between two
processes on one, so a series of raw times calls drift a change. The suite therefore builds
the anchor's kernels beside the commit's own (verify_attn.revision, namespace va_anchor) and
times each kernel in turn with its anchor twin on the same inputs: the ratio of the two
samples of a pair shares the process, the clock, the GPU and its memory, and does not move
with them. ``track_time_vs_anchor`` records those ratios; a kernel that did not change sits
at the same value on every start and every host of a GPU kind.

Each implementation is divided by its own op in the anchor's build; one the anchor does not
build (a peer: torch, FlashMLA; a kernel newer than the anchor) by the anchor's tc, a kernel
of the same work, so that its series too divides the machine out.

The anchor never moves with main: moving it starts new series (the benchmarks' version names
it). ``$VERIFY_ATTN_ANCHOR`` names another revision (a test's repository) or ``off``. The
sources come from the git repository asv runs in (``$ASV_CONF_DIR``), else from the checkout
this package lies in.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import registry

# torch, build and revision are imported where used: the benchmark modules read version() at
# import, in asv's fork server, which must not hold torch (verify_attn/gpu.py says why).

# Its kernels are the ones under test: a pair of two different kernels moves with the machine
# start (docs/timing.md, "A yardstick that is another kernel"). Every tc point that missed the
# spread goals over the runs of four or five starts against ffa97079 ran 4-16% off its twin's
# time; none within 3% did. 0c5ad00's kernels/ weigh the top split, which put tc 3-18% off
# ced6e38's twin at 32 points.
COMMIT = "0c5ad0049febf36d4eecad4d85d4e6d2b9773644"
NS = "va_anchor"
ENV = "VERIFY_ATTN_ANCHOR"
FALLBACK = "tc"  # the yardstick of an implementation the anchor does not build

_state: dict = {}


def commit() -> str:
    return os.environ.get(ENV) or COMMIT


def version() -> str:
    """What the drift-free series are recorded under (asv's benchmark version)."""
    return f"anchor-{commit()[:12]}"


def repository() -> Path | None:
    from . import build

    for where in (os.environ.get("ASV_CONF_DIR"), build.kernels_dir().parent.parent, build.kernels_dir().parent):
        if where and (Path(where) / ".git").exists():
            return Path(where)
    return None


def library():
    """The anchor's kernels as a build (verify_attn.revision) and the implementations it holds."""
    from . import revision

    return revision.library(repository(), commit(), NS)


def load() -> tuple[str | None, str]:
    """Build (cached by content) and load the anchor's kernels once per process: (NS, its
    commit) or (None, why not)."""
    if "result" not in _state:
        _state["result"] = _load()
    return _state["result"]


def _load() -> tuple[str | None, str]:
    from . import build, revision

    rev = commit()
    if rev == "off":
        return None, f"{ENV}=off"
    if repository() is None:
        return None, "no git repository to take the anchor's kernels from"
    try:
        lib, impls = library()
    except revision.RevisionError as exc:
        return None, f"anchor {rev[:12]}: {exc}"
    build.load_library(lib)
    _state["impls"] = set(impls)
    return NS, rev


def yardstick(impl: str, ns: str) -> str | None:
    """The anchor op that impl's samples are divided by: its own, else tc's; None if neither."""
    if ns is None:
        return None
    import torch

    ops = getattr(torch.ops, ns)
    entry = registry.get(impl)
    for name in ((impl,) if entry.compiled and not entry.runner else ()) + (FALLBACK,):
        if hasattr(ops, name):
            return name
    return None
