"""A timing table without asv: implementations side by side, speedup, TFLOP/s, % of peak.

Medians of the samples, implementations alternating in one process, inputs rotated past
twice the L2 (verify_attn.timer). Defaults: the headline cases of verify_attn.grid.

--variant IMPL:NAME=VALUE[,NAME=VALUE] adds an implementation run with environment variables
set, timed in the same alternation (a kernel's run-time switch against its default, e.g.
tc:VERIFY_ATTN_TC_MMA=1, tc's portable path on an H100/H200), checked like the others first.
"""

from __future__ import annotations

import os

import torch

from verify_attn import accuracy, cases, grid, ops, registry
from verify_attn.cost import cost_of
from verify_attn.machine import peaks
from verify_attn.measure import Result, input_sets, measure_case, op_args, prepare, skip_reason
from verify_attn.reference import reference
from verify_attn.timer import Timer


def variant(spec: str) -> tuple[str, str, dict[str, str]]:
    """IMPL:NAME=VALUE[,NAME=VALUE] -> (label, impl, environment)."""
    impl, _, assigns = spec.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if "=" in a)
    if impl not in registry.IMPLS or not env or len(env) != len(assigns.split(",")):
        raise ValueError(f"--variant: {spec!r} is not IMPL:NAME=VALUE[,NAME=VALUE] with IMPL one of "
                         f"{registry.names()}")
    return f"{impl}[{','.join(f'{k}={v}' for k, v in env.items())}]", impl, env


def set_env(env: dict[str, str | None]) -> None:
    """Set these variables (None: unset); os.environ writes through to the C environment that
    the kernels' launchers read."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def in_env(env: dict[str, str | None], call):
    """call, run with these variables set."""
    def run():
        set_env(env)
        return call()
    return run


def measure_variants(case: cases.Case, impls: list[str], variants: list[tuple], timer: Timer) -> dict[str, Result]:
    """measure_case with variants: every label checked against the reference in its own
    environment, then all timed side by side, each call in its own environment."""
    ops.load()
    sets = input_sets(case, timer.device, 0)
    first = sets[0]
    names = {name for _, _, env in variants for name in env}
    default = {name: os.environ.get(name) for name in names}
    runs = [(impl, impl, default) for impl in impls] + [(label, impl, {**default, **env}) for label, impl, env in variants]
    results, passing, ref = {}, {}, None
    for label, impl, env in runs:
        results[label] = Result(label, case.name, cost_of(first))
        reason = skip_reason(impl, case, first)
        if reason:
            results[label].skipped = reason
            continue
        if ref is None:
            ref = reference(first.q, first.kv, first.parent, first.prefix_lens, first.scale, first.kv_indices)
        set_env(env)
        results[label].error = accuracy.run_check(impl, first, ref)
        results[label].plan = ops.launch_plan(impl, op_args(first, *accuracy.poisoned_outputs(first.q)))
        if results[label].error.ok:
            passing[label] = [in_env(env, prepare(impl, s)) for s in sets]
    timings = timer.time_many(passing)  # each call sets its own variables
    set_env(default)
    base = timings.get(registry.baseline())
    for label, timing in timings.items():
        results[label].timing = timing
        results[label].baseline_s = base.median if base else None
    return results

from .cli import need_gpu, parser


def main(argv=None) -> int:
    d = grid.MEASURE_DEFAULT
    p = parser("measure", __doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--impl", nargs="+", default=list(registry.names()), choices=registry.names())
    p.add_argument("--heads", nargs="+", type=int, default=list(d["heads"]))
    p.add_argument("--q-len", nargs="+", type=int, default=list(d["q_lens"]))
    p.add_argument("--prefix-len", nargs="+", type=int, default=list(d["prefix_lens"]))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tree", default="random", choices=cases.TREES)
    p.add_argument("--pad-to", type=int, default=None,
                   help="kv rows per element rounded up to a multiple of this (default: 64 for a chain, as the "
                        "Chain benchmarks, so that FlashMLA's 64-token pages can read it; else 1)")
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--cold", action="store_true", help="flush the L2 cache before every call")
    p.add_argument("--variant", action="append", default=[], metavar="IMPL:NAME=VALUE[,NAME=VALUE]",
                   help="also time IMPL with these environment variables set (repeatable)")
    args = p.parse_args(argv)
    try:
        variants = [variant(v) for v in args.variant]
    except ValueError as exc:
        p.error(str(exc))
    if args.device == "cuda":
        need_gpu("--device cuda")
    peak = peaks(args.device)
    timer = Timer(args.device, samples=args.samples, cold=args.cold)
    base = registry.baseline()
    print(f"# {peak.device}: peaks {peak.flops / 1e12:.0f} TFLOP/s, {peak.bytes_per_s / 1e9:.0f} GB/s ({peak.source}); "
          f"median of {args.samples} samples, impls alternating; x{base} = {base} time / time")
    width = max([8, *(len(label) for label, _, _ in variants)])
    print(f"{'case':22s} {'impl':{width}s} {'ms':>9s} {'x' + base:>8s} {'TFLOP/s':>8s} {'GB/s':>7s} {'%peak':>6s} "
          f"{'MHz':>5s} {'max_rel':>8s}  plan")
    failed = 0
    for heads in args.heads:
        for q_len in args.q_len:
            for prefix in args.prefix_len:
                pad = args.pad_to or (grid.CHAIN.pad_to if args.tree == "chain" else 1)
                case = cases.grid_case(heads, q_len, prefix, args.batch, args.tree, pad)
                measured = (measure_variants(case, args.impl, variants, timer) if variants
                            else measure_case(case, args.impl, timer))
                for impl, r in measured.items():
                    if r.skipped:
                        print(f"{case.name:22s} {impl:{width}s} skipped: {r.skipped}")
                        continue
                    if r.timing is None:
                        failed += 1
                        print(f"{case.name:22s} {impl:{width}s} FAILED CHECK: {r.error.reason}")
                        continue
                    speed = f"{r.speedup:.2f}" if r.speedup else "-"
                    clock = f"{r.timing.sm_clock_mhz:.0f}" if r.timing.sm_clock_mhz else "-"
                    plan = (f"blocks={r.plan['blocks']} splits={r.plan['num_splits']} rows/block={r.plan['rows_per_block']}"
                            if r.plan else "")
                    print(f"{case.name:22s} {impl:{width}s} {r.timing.median * 1e3:9.4f} {speed:>8s} {r.tflops():8.2f} "
                          f"{r.gbps():7.0f} {100 * r.peak_fraction(peak):6.2f} {clock:>5s} {r.error.max_rel:8.2g}  {plan}",
                          flush=True)
    return 1 if failed else 0
