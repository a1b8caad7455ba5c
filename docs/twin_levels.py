"""Where a kernel's drift-free ratio settles against an identical twin, in this process (H200).

    python docs/twin_levels.py [--one-set]   # from the repository root, a GPU and the anchor's build at hand

Per point, tc against the anchor's tc (the same machine code, another library) with the suite's
timer and pairing (16 samples, verify_attn.measure.paired_ratios), four ways, twice:
  suite  each side with its own outputs, as the suite times them
  swap   the two sides' outputs exchanged
  same   both sides writing one set of outputs
  self   tc against tc itself, each side with its own outputs
Run it in several processes: 'self' stays within about 0.3% of 1 while the other three move
together from process to process (README, "The recorded history"), so the level belongs to the
two loaded copies of the kernel, not to the data or the timer. --one-set times every call on
the first input set alone, so the inputs no longer push the kernels' code out of the L2 between
calls. Run on one H200 start (docs/timing.md, "Two copies of one kernel"): the levels did not
close up, so instruction fetch after eviction is not their cause.
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify_attn import accuracy, candidate, measure, ops, suite  # noqa: E402
from verify_attn.measure import paired_ratios  # noqa: E402

POINTS = (("Quick", "quick", 64, 9, 2048), ("Chain", "chain", 16, 9, 16384), ("Heads16", "full", 16, 9, 16384),
          ("Chain", "chain", 8, 9, 2048),
          ("Heads64", "full", 64, 9, 16384))


def main() -> None:
    one_set = "--one-set" in sys.argv[1:]
    ops.load()
    ns = suite.anchored()
    if ns is None:
        raise SystemExit("no anchor build here: the twin comes from it (verify_attn/anchor.py)")
    tm = suite.timer(samples=16)
    for name, variant, h, q, p in POINTS:
        sets = measure.input_sets(suite.case_of(variant, (h, q, p)), tm.device, 0)
        sets = sets[:1] if one_set else sets
        kernel, twin = candidate.Candidate("tc"), candidate.Candidate("tc", ns)
        for c in (kernel, twin):
            if not candidate.check(c, sets[0]).ok:
                raise SystemExit(f"{c.name} fails h{h} q{q} p{p}")
        outs_k = [accuracy.poisoned_outputs(s.q) for s in sets]
        outs_t = [accuracy.poisoned_outputs(s.q) for s in sets]

        def calls(c, outs):
            fn = c.op()
            return [(lambda s=s, o=o: fn(*candidate.op_args(s, *o))) for s, o in zip(sets, outs)]

        ways = {"suite": (calls(kernel, outs_k), calls(twin, outs_t)), "swap": (calls(kernel, outs_t), calls(twin, outs_k)),
                "same": (calls(kernel, outs_k), calls(twin, outs_k)), "self": (calls(kernel, outs_k), calls(kernel, outs_t))}
        line = []
        for _ in range(2):
            for way, (a, b) in ways.items():
                t = tm.time_many({"a": a, "b": b}, reverse_odd_rounds=True)
                line.append(f"{way} {statistics.median(paired_ratios(t['a'].samples, t['b'].samples)):.4f}")
        print(f"{name:8s} h{h} q{q} p{p}: " + "  ".join(line), flush=True)


if __name__ == "__main__":
    main()
