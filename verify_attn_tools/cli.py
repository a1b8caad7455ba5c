"""The command line: ``python -m verify_attn VERB [ARGS]``; ``python -m verify_attn VERB --help``.

Every verb is a module of this package with ``main(argv) -> int`` and a one-line summary
as the first line of its docstring. Bad arguments exit 2; a verb that needs a GPU on a
machine without one says so in one line and exits 1.
"""

from __future__ import annotations

import importlib
import os
import sys

# verb -> one line; the module verify_attn_tools.<verb> does the work.
VERBS = {
    "run": "asv over commits on this machine's default device (default HEAD), then publish",
    "publish": "results/ -> html/ (asv publish + plots); no GPU, no re-run; --serve to look",
    "history": "which commits changed measured code and which of those lack results",
    "backfill": "fill the history's holes (or given commits) with asv, one shard per GPU",
    "check": "parity of every implementation on every named case (exit 1 on a failure)",
    "measure": "a timing table without asv: speedup, TFLOP/s, % of peak, launch plan",
    "resources": "registers, shared memory, spills, occupancy of every kernel, from nvcc",
    "crosscheck": "the timer against the profiler's kernel time (GPU)",
    "detect": "how often the PR check flags planted slowdowns, and a no-op (GPU)",
    "machine": "this box's asv machine name and the ceilings fractions of peak use",
    "spread": "how far one commit's series move between machine starts (exit 0 goals met, 1 not, 2 refused)",
    "ab": "a base commit's kernels against the checkout's, paired in one process (exit 0/1/2)",
    "sass": "which kernels' machine code a change moved: BASE against the working tree, instruction by instruction (nvcc)",
    "tables": "the README's H200 tables (Chain, ServingChain, Serving) from one commit's recorded results",
    "artifacts": "check an unpacked results artifact (names, sizes, asv's JSON shape) before it is committed",
    "ptx-reads": "registers kernels read before writing them at source lines where BASE's do not (nvcc, no GPU)",
    "stalls": "two ncu source pages of a kernel side by side: where a change moved its warps' samples (no GPU)",
    "stream": "each implementation's kernels as a timed sample runs them: durations, overlaps, gaps (CUPTI; GPU)",
    "report": "a PR's verdict from recorded results, judged by the drift-free series (exit 0 ok, 1 slower, 2 failed or refused, 3 no results, 4 a malformed results file)",
}


class Refusal(Exception):
    """A verb cannot run here (no GPU, no nvcc, no asv): one line for the user, exit 1."""


def usage() -> str:
    lines = ["usage: python -m verify_attn VERB [ARGS]   (python -m verify_attn VERB --help)", "", "verbs:"]
    lines += [f"  {verb:11s} {line}" for verb, line in VERBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"python -m verify_attn: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"verify_attn_tools.{verb.replace('-', '_')}")
    try:
        return module.main(rest)
    except Refusal as exc:
        print(f"python -m verify_attn {verb}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`| head`): stop as a Unix filter does, without a traceback, and
        # point stdout at /dev/null so that the flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def refusing(verb: str, body, argv, code: int = 2) -> int:
    """body(argv), a refusal one line on stderr and exit `code`: for verbs whose exit 1 means
    something else (a goal missed, slower) than main's "cannot run here"."""
    try:
        return body(argv)
    except Refusal as exc:
        print(f"python -m verify_attn {verb}: {exc}", file=sys.stderr)
        return code


def need_gpu(what: str = "this verb") -> None:
    """Refuse in one line when torch sees no GPU."""
    import torch

    if not torch.cuda.is_available():
        raise Refusal(f"{what} needs a CUDA GPU and torch sees none "
                      f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not compiled in'})")


def bounded(low: int, high: int | None = None):
    """An argparse type: an int in [low, high], else argparse's one-line error naming the option."""
    import argparse

    def value(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < low or high is not None and n > high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {n}" if high is not None
                                             else f"must be at least {low}, got {n}")
        return n

    return value


def parser(verb: str, doc: str | None):
    """An argparse parser for a verb: its prog and description from the module docstring."""
    import argparse

    text = (doc or "").strip()
    return argparse.ArgumentParser(prog=f"python -m verify_attn {verb}", description=text.splitlines()[0] if text else None,
                                   epilog="\n".join(text.splitlines()[1:]).strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
