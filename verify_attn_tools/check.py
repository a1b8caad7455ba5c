"""Parity of every implementation on every named case against the float64 reference
(verify_attn.parity, which the Quick benchmarks also run before timing anything).

Prints PASS, FAIL or SKIP (with the reason), the implementation, the case, its shape,
max_abs and max_rel, one line each, and exits 1 on any FAIL, and when nothing was checked
(every implementation skipped: a library lacking the ops, a kernel this device cannot run). FILE arguments are bundles of
captured inputs (verify_attn.cases.save_bundle) to replay; each is put through the op's own
input checks first, and one that fails them is a "FAIL load FILE: why" line. Tolerances: verify_attn/accuracy.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from verify_attn import accuracy, cases, machine, ops, parity, registry
from verify_attn.candidate import of, outcomes

from .cli import need_gpu, parser


def validated(inputs: cases.Inputs) -> cases.Inputs:
    """The op's own input checks (verify_attn.ops.validate: shapes, types, then the values of
    parent, prefix_lens and kv_indices), before anything runs on the inputs: a crafted bundle (an
    index of 1e9, an invalid parent, a prefix longer than kv, a wrong last dimension) gets the
    op's message instead of a traceback from the float64 reference. Raises ValueError."""
    q = inputs.q
    if q.dim() != 4:  # poisoned_outputs needs [batch, q_len, heads, _]
        raise ValueError(f"q must be [batch, q_len, heads, 576], got shape {list(q.shape)}")
    try:
        ops.validate(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices,
                     *accuracy.poisoned_outputs(q))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise ValueError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
    return inputs


def main(argv=None) -> int:
    p = parser("check", __doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--impl", action="append", choices=(*registry.names(), "all"),
                   help="default: the kernels under test; all: every registered implementation")
    p.add_argument("--case", action="append", choices=sorted(cases.CASES),
                   help="default: every named case (on the CPU, those not marked large)")
    p.add_argument("--seed", type=int, default=None, help="default: a fresh random seed, printed")
    p.add_argument("files", nargs="*", help="bundle files to replay")
    args = p.parse_args(argv)
    for f in args.files:  # `--impl a b` reads b as a bundle to replay: say so before anything runs
        for flag, names in (("--impl", (*registry.names(), "all")), ("--case", cases.CASES)):
            if f in names and not Path(f).exists():
                p.error(f"{f!r} is a name for {flag}, not a bundle file: {flag} takes one name, so give it "
                        f"once per name ({flag} NAME1 {flag} NAME2)")
    if args.device == "cuda":
        need_gpu("--device cuda")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    impls = args.impl or list(registry.under_test())
    if "all" in impls:
        impls = list(registry.names())
    if args.case:
        chosen = [cases.CASES[n] for n in args.case]
    elif args.files:
        chosen = []
    else:
        chosen = parity.named(args.device)
    card = f" ({machine.device_name(args.device)})" if args.device == "cuda" else ""
    print(f"# device {args.device}{card}, seed {seed}, tolerance: see verify_attn/accuracy.py", flush=True)

    work = [(c.name, c, lambda c=c: cases.make_inputs(c, args.device, seed)) for c in chosen]
    work += [(f, None, lambda f=f: validated(cases.load_bundle(f).to(args.device))) for f in args.files]
    failed = checked = 0
    w = max(map(len, impls), default=8)  # one column for the names, the longest included
    for name, case, make in work:
        try:
            inputs = make()
        except ValueError as exc:
            print(f"FAIL load {name}: {exc}", flush=True)
            failed += 1
            continue
        shape = " ".join(f"{k}={v}" for k, v in inputs.shape.items())
        for o in outcomes(inputs, of(impls)):
            if o.skipped:
                print(f"SKIP {o.impl:{w}s} {name:24s} {shape}  ({o.skipped})", flush=True)
                continue
            err = o.error
            failed += not err.ok
            checked += 1
            note = f"  ({err.reason})" if err.reason else ""
            print(f"{'PASS' if err.ok else 'FAIL'} {o.impl:{w}s} {name:24s} {shape} max_abs={err.max_abs:.3g} "
                  f"max_rel={err.max_rel:.3g}{note}", flush=True)
    if not failed and not checked:
        print(f"FAIL nothing checked: every implementation was skipped ({', '.join(impls)} on {args.device})",
              flush=True)
        return 1
    return 1 if failed else 0
