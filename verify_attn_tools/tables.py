"""The README's H200 tables from one commit's recorded results (Chain, ServingChain, Serving).

    python -m verify_attn tables COMMIT [--before COMMIT] [--machine nvidia-h200]

Markdown on stdout, every figure read from results/<machine>/<commit>-*.json: asv's median a
point, TFLOP/s by the dense count the suite records (track_flops), % of the tree-aware roofline
from track_time_vs_roofline. --before adds that commit's tc / FlashMLA at the serving steps.
tests/test_tables.py checks that the README's tables are this output for the commits it names,
so a figure there is a recorded one.
"""

from __future__ import annotations

from . import ROOT
from .cli import parser
from .report import git_hash, load

CHAIN_HEAD = ("| case | tc ms (TFLOP/s, % of roofline) | flash ms | torch ms | FlashMLA ms (TFLOP/s, %) "
              "| tc / FlashMLA | torch / tc |")
SERVING_CHAIN_HEAD = "| batch | heads | q_len | tc ms (TFLOP/s, % of roofline) | FlashMLA ms (TFLOP/s, %) | tc / FlashMLA |"
SERVING_HEAD = "| batch | heads | q_len | tc ms | flash ms | torch ms | torch / tc |"


def values(data: dict, cls: str, metric: str) -> dict:
    """{params: median} of one series of the loaded results (report.load); {} where not recorded."""
    _, pts = data.get(f"bench_verify_attn.{cls}.{metric}", (None, {}))
    return {combo: v for combo, (v, _, _) in pts.items()}


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.4g}"


def rule(head: str) -> str:
    return "|" + " --- |" * (head.count("|") - 1)


class Shapes:
    """One class's time, FLOPs and roofline multiple, and the cell of an implementation at a shape."""

    def __init__(self, data: dict, cls: str):
        self.time = values(data, cls, "track_time")
        self.flops = values(data, cls, "track_flops")
        self.roof = values(data, cls, "track_time_vs_roofline")

    def shapes(self) -> list[tuple]:
        return sorted({combo[:-1] for combo in self.time})

    def t(self, shape: tuple, impl: str) -> float | None:
        return self.time.get((*shape, impl))

    def cell(self, shape: tuple, impl: str) -> str:
        """ms (TFLOP/s, % of roofline), or ms alone where the count or the roofline is missing."""
        x, f, r = self.t(shape, impl), self.flops.get((*shape, impl)), self.roof.get((*shape, impl))
        return f"{ms(x)} ({f / x / 1e12:.0f}, {100 / r:.0f}%)" if x and f and r else ms(x)


def chain(data: dict) -> str:
    s = Shapes(data, "Chain")
    rows = [CHAIN_HEAD, rule(CHAIN_HEAD)]
    for shape in s.shapes():
        h, q, p = shape
        tc, fm, to = s.t(shape, "tc"), s.t(shape, "flashmla"), s.t(shape, "torch")
        rows.append(f"| heads {h}, q_len {q}, prefix {p:,} | {s.cell(shape, 'tc')} | {ms(s.t(shape, 'flash'))} "
                    f"| {ms(to)} | {s.cell(shape, 'flashmla')} | {tc / fm:.2f} | {to / tc:.1f} |")
    return "\n".join(rows)


def serving_chain(data: dict, before: dict | None = None, before_name: str = "") -> str:
    s = Shapes(data, "ServingChain")
    old = Shapes(before, "ServingChain") if before else None
    head = SERVING_CHAIN_HEAD + (f" at {before_name} |" if old else "")
    rows = [head, rule(head)]
    for shape in s.shapes():
        b, h, q = shape
        cells = [str(b), str(h), str(q), s.cell(shape, "tc"), s.cell(shape, "flashmla"),
                 f"{s.t(shape, 'tc') / s.t(shape, 'flashmla'):.2f}"]
        if old:
            cells.append(f"{old.t(shape, 'tc') / old.t(shape, 'flashmla'):.2f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def serving(data: dict) -> str:
    s = Shapes(data, "Serving")
    rows = [SERVING_HEAD, rule(SERVING_HEAD)]
    for shape in s.shapes():
        b, h, q = shape
        tc, to = s.t(shape, "tc"), s.t(shape, "torch")
        rows.append(f"| {b} | {h} | {q} | {ms(tc)} | {ms(s.t(shape, 'flash'))} | {ms(to)} | {to / tc:.1f} |")
    return "\n".join(rows)


def tables(commit: str, before: str | None = None, machine: str = "nvidia-h200", results_dir=None) -> list[str]:
    """The three tables of commit's results (ServingChain with before's ratio beside)."""
    results_dir = results_dir or ROOT / "results"
    data = load(results_dir, machine, git_hash(commit))
    old = load(results_dir, machine, git_hash(before)) if before else None
    return [chain(data), serving_chain(data, old, before or ""), serving(data)]


def main(argv=None) -> int:
    p = parser("tables", __doc__)
    p.add_argument("commit", help="the commit whose results fill the tables (a hash or its first 8 digits)")
    p.add_argument("--before", help="a commit whose tc / FlashMLA at the serving steps goes beside")
    p.add_argument("--machine", default="nvidia-h200", help="the asv machine name under results/")
    args = p.parse_args(argv)
    print("\n\n".join(tables(args.commit, args.before, args.machine)))
    return 0
