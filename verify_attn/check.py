"""Parity check: every implementation against the float64 reference, one line per case.

    python -m verify_attn.check [--device cpu|cuda] [--impl NAME] [--case NAME] [--seed N] [FILE...]

Prints PASS or FAIL, implementation, case, batch, heads, q_len, kv_len, max_abs, max_rel,
and exits 1 on any FAIL. FILE arguments are bundles (verify_attn.cases.save_bundle).
Tolerances: verify_attn/accuracy.py.
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from . import accuracy, cases, ops
from .reference import reference


def run_check(impl: str, inputs: cases.Inputs, ref=None) -> accuracy.Error:
    """Run one implementation on poisoned outputs and measure it against the reference."""
    if ref is None:
        ref = reference(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices)
    out, lse = accuracy.poisoned_outputs(inputs.q)
    ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale,
                         kv_indices=inputs.kv_indices, impl=impl, out=out, lse=lse)
    return accuracy.measure(impl, out, lse, *ref)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verify_attn.check", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--impl", action="append", choices=ops.IMPLS, help="default: naive and flash")
    parser.add_argument("--case", action="append", choices=sorted(cases.CASES),
                        help="default: every named case (on the CPU, those not marked large)")
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh random seed, printed")
    parser.add_argument("files", nargs="*", help="bundle files to replay")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    impls = args.impl or list(ops.KERNELS)
    if args.case:
        chosen = [cases.CASES[n] for n in args.case]
    elif args.files:
        chosen = []
    else:
        chosen = [c for c in cases.CASES.values() if args.device == "cuda" or not c.large]
    print(f"# device {args.device}, seed {seed}, tolerance: see verify_attn/accuracy.py", flush=True)

    work = [(c.name, lambda c=c: cases.make_inputs(c, args.device, seed)) for c in chosen]
    work += [(f, lambda f=f: cases.load_bundle(f).to(args.device)) for f in args.files]
    failed = 0
    for name, make in work:
        try:
            inputs = make()
        except ValueError as exc:
            print(f"FAIL load {name}: {exc}", flush=True)
            failed += 1
            continue
        ref = reference(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices)
        shape = " ".join(f"{k}={v}" for k, v in inputs.shape.items())
        for impl in impls:
            try:
                err = run_check(impl, inputs, ref)
            except (RuntimeError, ValueError) as exc:
                err = accuracy.Error(float("nan"), float("nan"), float("nan"), False, str(exc).splitlines()[0])
            verdict = "PASS" if err.ok else "FAIL"
            failed += not err.ok
            note = f"  ({err.reason})" if err.reason else ""
            print(f"{verdict} {impl:6s} {name:24s} {shape} max_abs={err.max_abs:.3g} max_rel={err.max_rel:.3g}{note}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
