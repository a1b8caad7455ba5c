"""Plots of the recorded history, drawn from results/ alone (no GPU, no re-run).

Drawn by ``python -m verify_attn publish``. Results are read with asv's own loader. Every
timing series is stored lower-is-better (see benchmarks/common.py), so speedup =
1 / track_time_vs_naive and fraction of peak = 1 / track_time_vs_roofline. FLOPs and bytes
are those recorded with each commit's results (track_flops, track_bytes); results from
before they were recorded fall back to today's cost model on the suite's seed-0 inputs. The
implementations, their colours and the headline cases come from verify_attn.registry and
verify_attn.grid. A plot that has no data is skipped with a logged reason: a
commit lacking a benchmark (a pull request that ran only Quick, a failed build) is normal.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import html
import itertools
import logging
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on the CI or GPU machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from asv import results as asv_results  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from verify_attn import grid, registry  # noqa: E402

log = logging.getLogger("verify_attn.plots")

BENCH = "bench_verify_attn"
# The full grids, whose head count is in the name. Quick is a few points a head count, ColdL2
# another cache state: neither is mixed into the per-heads plots.
HEADS = {f"Heads{h}": h for h in grid.HEADS}
# Pull requests run only Quick, which measures the headline points on a GPU, so it fills in
# for the full grid's class at the headline's head count.
HEADLINE_SOURCES = (f"Heads{grid.HEADLINE['heads']}", "Quick")


REFERENCE = "flashmla"  # the line to beat: black, thick, dashed, stars, on every plot where it ran
LINESTYLES = [":", "--", "-", "-.", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)), (0, (5, 2, 1, 2, 1, 2)), (0, (8, 2)),
              (0, (2, 1, 2, 3)), (0, (6, 1, 1, 1, 1, 1))]
MARKERS = "osD^vPX<>hpd"


def impl_style(impl: str) -> dict:
    """One style per implementation, the same in every plot: its registry colour, a line style
    and a marker of its own (by registry position; FlashMLA the black reference line)."""
    if impl == REFERENCE:
        return {"color": "k", "ls": "--", "marker": "*", "lw": 2.5, "ms": 9, "zorder": 5}
    known = [i for i in registry.IMPLS if i != REFERENCE]
    k = known.index(impl) if impl in known else len(known) + sum(map(ord, impl)) % len(MARKERS)
    return {"color": registry.color(impl), "ls": LINESTYLES[k % len(LINESTYLES)], "marker": MARKERS[k % len(MARKERS)],
            "lw": 1.5, "ms": 5}


def handle(impl: str, label: str | None = None) -> Line2D:
    return Line2D([], [], label=label or (f"{impl} (reference)" if impl == REFERENCE else impl), **impl_style(impl))


def plain(v: float) -> str:
    """A tick value as a plain decimal: 0.05, 2, 300 (never 5e-02 or 10^2)."""
    return np.format_float_positional(float(v), precision=3, fractional=False, trim="-")


SPEEDUP_TICKS = FuncFormatter(lambda v, _: f"{plain(v)}x")
PERCENT_TICKS = FuncFormatter(lambda v, _: f"{plain(100 * v)}%")  # of a fraction: 0.25 -> 25%
PLAIN_TICKS = FuncFormatter(lambda v, _: plain(v))


def log_ticks(axis, formatter, lo: float, hi: float) -> None:
    """Labelled major ticks at 1-2-5 (1 on a long range), unlabelled minor ones: one format,
    no overlapping labels."""
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12 if decades <= 8 else 8))
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def data_range(axes, axis: str = "y") -> tuple[float, float]:
    values = [v for ax in np.ravel(axes) for line in ax.get_lines() + ax.collections
              for v in (np.ravel(line.get_ydata() if axis == "y" else line.get_xdata()) if isinstance(line, Line2D)
                        else np.ravel(line.get_offsets()[:, 1 if axis == "y" else 0]))
              if np.isfinite(v) and v > 0]
    return (min(values), max(values)) if values else (1.0, 10.0)


def prefix_label(p: int) -> str:
    return f"{p // 1024}K" if p >= 1024 and p % 1024 == 0 else str(p)


def legend_outside(fig, handles) -> None:
    """The legend right of every panel (a constrained layout makes room), never over data."""
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def ordered(impls) -> list[str]:
    """Implementations in registry order, unknown ones (from old results) last."""
    known = list(registry.IMPLS)
    return sorted(set(impls), key=lambda i: (known.index(i) if i in known else len(known), i))


class Skip(Exception):
    """A plot that cannot be drawn from these results; the message says why."""


@dataclasses.dataclass
class Run:
    """One commit's results on one machine: benchmark name -> {params tuple: value}."""

    commit: str
    date: int
    values: dict

    def grid(self, cls: str, metric: str) -> dict:
        """{parameter tuple: value} of bench_verify_attn.<cls>.<metric>; (q_len, prefix_len, impl)
        for a HeadsN class."""
        return self.values.get(f"{BENCH}.{cls}.{metric}", {})

    def scalar(self, name: str):
        return self.values.get(name, {}).get(())


@dataclasses.dataclass
class Ceilings:
    tflops: float
    gbps: float
    source: str


def machines(results_dir) -> list[str]:
    return sorted(p.parent.name for p in Path(results_dir).glob("*/machine.json"))


def load_runs(results_dir, machine: str) -> list[Run]:
    """The machine's runs, oldest commit first (ties broken by hash, to stay deterministic)."""
    runs: dict[str, Run] = {}
    for res in asv_results.iter_results_for_machine(str(results_dir), machine):
        run = runs.setdefault(res.commit_hash, Run(res.commit_hash, res.date or 0, {}))
        for key in res.get_all_result_keys():
            params = res.get_result_params(key)
            values = res.get_result_value(key, params)
            # asv keeps parameter values as their repr ("9", "'flash'"); a scalar has params []
            # and one value under the empty tuple.
            combos = itertools.product(*[[ast.literal_eval(v) for v in p] for p in params])
            for combo, value in zip(combos, values):
                if isinstance(value, (int, float)) and math.isfinite(value):
                    run.values.setdefault(key, {})[combo] = float(value)
    return sorted(runs.values(), key=lambda r: (r.date, r.commit))


def ceilings(runs: list[Run], machine: str) -> Ceilings | None:
    """The peaks the fractions of peak were computed against: those recorded by
    bench_machine (newest first), else the table by machine name, else none (CPU, unknown GPU)."""
    for run in reversed(runs):
        tflops = run.scalar("bench_machine.Machine.track_peak_tflops")
        gbps = run.scalar("bench_machine.Machine.track_peak_gbps")
        if tflops and gbps:
            return Ceilings(tflops, gbps, f"recorded at {run.commit[:8]}")
    from verify_attn.machine import KNOWN

    for name, p in KNOWN.items():  # asv machine names are the GPU's, lowercased, dashed
        if machine in (name, name.lower().replace(" ", "-")):
            return Ceilings(p.flops / 1e12, p.bytes_per_s / 1e9, "verify_attn.machine.KNOWN")
    return None


@functools.lru_cache(maxsize=None)
def modelled_cost(heads: int, q_len: int, prefix_len: int) -> tuple[float, float]:
    """(flops, bytes) of a grid point by today's cost model on the suite's seed-0 inputs: only
    for results recorded before the suite kept FLOPs and bytes with them."""
    from verify_attn.cases import grid_case, make_inputs
    from verify_attn.cost import cost_of

    c = cost_of(make_inputs(grid_case(heads, q_len, prefix_len), "cpu", 0))
    return c.flops, c.bytes


def point_cost(run: "Run", cls: str, heads: int, key: tuple) -> tuple[float, float]:
    """(flops, bytes) of a measured point: as recorded with the run, else modelled."""
    flops, bytes_ = run.grid(cls, "track_flops").get(key), run.grid(cls, "track_bytes").get(key)
    if flops and bytes_:
        return flops, bytes_
    return modelled_cost(heads, key[0], key[1])


def latest(runs: list[Run], cls: str, metric: str):
    """(run, grid) of the newest commit that has this benchmark, or None."""
    for run in reversed(runs):
        if run.grid(cls, metric):
            return run, run.grid(cls, metric)
    return None


HEADS_SIZES = (18, 36, 72)  # marker area by head count in the roofline (the marker is the implementation's)


def plot_roofline(runs: list[Run], ceil: Ceilings | None, path: Path, machine: str = "") -> None:
    """Achieved TFLOP/s against arithmetic intensity (log-log) under the machine's ceilings; the
    FlashMLA reference from the newest Chain run that timed it."""
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    xs, drawn = [], []
    heads_order = sorted(HEADS.values())

    def scatter(pts, impl, heads):
        x = [f / b for (f, b), _ in pts]
        xs.extend(x)
        st = impl_style(impl)
        ax.scatter(x, [f / t / 1e12 for (f, _), t in pts], color=st["color"], marker=st["marker"],
                   s=HEADS_SIZES[heads_order.index(heads) % 3] if heads in heads_order else 36, alpha=0.85,
                   edgecolors="k" if impl == REFERENCE else "none", zorder=st.get("zorder", 2))
        if impl not in drawn:
            drawn.append(impl)

    for cls, heads in HEADS.items():
        found = latest(runs, cls, "track_time")
        if not found:
            continue
        run, times = found
        for impl in ordered(i for _, _, i in times):
            pts = [(point_cost(run, cls, heads, key), t) for key, t in sorted(times.items()) if key[2] == impl and t > 0]
            if pts:
                scatter(pts, impl, heads)
    if not xs:
        plt.close(fig)
        raise Skip("no track_time results of Heads8/16/64")
    for run in reversed(runs):  # FlashMLA, where it ran: Chain's batch-1 points
        chain, flops = run.grid("Chain", "track_time"), run.grid("Chain", "track_flops")
        bytes_ = run.grid("Chain", "track_bytes")
        pts = {h: [((flops[k], bytes_.get(k) or modelled_cost(h, q, p)[1]), t) for k, t in chain.items()
                   for (h2, q, p, i) in [k] if i == REFERENCE and h2 == h and t > 0 and flops.get(k)]
               for h in heads_order}
        if any(pts.values()):
            for h, hp in pts.items():
                if hp:
                    scatter(hp, REFERENCE, h)
            break
    handles = [handle(i) for i in ordered(drawn)]
    handles = [Line2D([], [], color=h.get_color(), marker=h.get_marker(), ls="", label=h.get_label(),
                      markeredgecolor="k" if h.get_label().startswith(REFERENCE) else h.get_color()) for h in handles]
    handles += [Line2D([], [], color="0.4", marker="o", ls="", ms=math.sqrt(s), label=f"{h} heads")
                for h, s in zip(heads_order, HEADS_SIZES)]
    if ceil:
        # The roof: bandwidth-bound left of the ridge, compute-bound right of it.
        ridge = ceil.tflops * 1e3 / ceil.gbps
        lo, hi = min(min(xs), ridge) / 2, max(max(xs), ridge) * 2
        handles += ax.plot([lo, ridge], [ceil.gbps * lo / 1e3, ceil.tflops], color="0.3", ls=":",
                           label=f"bandwidth ceiling {ceil.gbps:.0f} GB/s")
        handles += ax.plot([ridge, hi], [ceil.tflops, ceil.tflops], color="0.3", ls="-.",
                           label=f"compute ceiling {ceil.tflops:.0f} TFLOP/s")
        note = f"ceilings {ceil.source}"
    else:
        note = "no ceilings: no peaks recorded or known for this machine"
        log.warning("%s roofline: %s", machine, note)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte, tree-aware cost model)",
           ylabel="achieved TFLOP/s", title=f"Roofline, {machine}\n({note})")
    log_ticks(ax.xaxis, PLAIN_TICKS, *data_range([ax], "x"))
    log_ticks(ax.yaxis, PLAIN_TICKS, *data_range([ax], "y"))
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(fig, handles)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _per_heads(runs: list[Run], metric: str, impls, ylabel: str, title: str, path: Path,
               formatter=SPEEDUP_TICKS, ref: str | None = None) -> list[str]:
    """1 / metric against prefix length, a panel per (q_len, head count) from the newest commit
    that measured the head count, a line per implementation in its own style; FlashMLA's points
    from the newest Chain run that recorded the metric, where it ran. ref: an implementation
    drawn as the line at 1 (the baseline of a speedup). Returns the implementations drawn."""
    panels = [(heads, found) for cls, heads in HEADS.items() if (found := latest(runs, cls, metric))]
    chain = next((run.grid("Chain", metric) for run in reversed(runs)
                  if any(k[3] == REFERENCE for k in run.grid("Chain", metric))), {})
    q_lens = sorted({q for _, (_, g) in panels for q, _, _ in g})
    names = ordered([i for _, (_, g) in panels for _, _, i in g if impls(i)])
    fig, axes = plt.subplots(max(1, len(q_lens)), max(1, len(panels)), squeeze=False, sharey=True, layout="constrained",
                             figsize=(2.0 + 3.4 * max(1, len(panels)), 1.2 + 2.6 * max(1, len(q_lens))))
    drawn = []
    for row, q in enumerate(q_lens):
        for col, (heads, (run, g)) in enumerate(panels):
            ax = axes[row][col]
            # Prefix lengths as categories: they include 0, which a log axis cannot show.
            prefixes = sorted({p for _, p, _ in g} | {p for h, qq, p, i in chain if (h, qq) == (heads, q)})
            series = {i: {p: 1 / v for (qq, p, ii), v in g.items() if qq == q and ii == i and v > 0} for i in names}
            series[REFERENCE] = {p: 1 / v for (h, qq, p, i), v in chain.items() if (h, qq, i) == (heads, q, REFERENCE) and v > 0}
            for impl, pts in series.items():
                if pts:
                    ax.plot([prefixes.index(p) for p in sorted(pts)], [pts[p] for p in sorted(pts)], **impl_style(impl))
                    if impl not in drawn:
                        drawn.append(impl)
            if ref is not None:
                ax.axhline(1.0, **{**impl_style(ref), "marker": None, "lw": 1.0})
            ax.set_xticks(range(len(prefixes)), [prefix_label(p) for p in prefixes])
            ax.set(yscale="log", title=f"{heads} heads, q_len {q} @{run.commit[:8]}")
            ax.title.set_fontsize(9)
            ax.grid(True, which="both", alpha=0.3)
            if row == len(q_lens) - 1:
                ax.set_xlabel("prefix length")
    if not drawn:
        plt.close(fig)
        raise Skip(f"no {metric} results in Heads{'/'.join(str(h) for h in HEADS.values())}")
    for row in axes:
        row[0].set_ylabel(ylabel)
    log_ticks(axes[0][0].yaxis, formatter, *data_range(axes))
    handles = [handle(i) for i in ordered(drawn)]
    if ref is not None:
        handles.append(Line2D([], [], **{**impl_style(ref), "marker": None, "lw": 1.0}, label=f"{ref} (= 1)"))
    legend_outside(fig, handles)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return ordered(drawn)


def plot_speedup(runs: list[Run], path: Path, machine: str = "") -> list[str]:
    """Speedup over naive (1 / track_time_vs_naive) against prefix length."""
    base = registry.baseline()
    return _per_heads(runs, "track_time_vs_naive", lambda i: i != base, f"speedup over {base}",
                      f"Speedup over naive, {machine}", path, SPEEDUP_TICKS, ref=base)


def plot_peak_fraction(runs: list[Run], path: Path, machine: str = "") -> list[str]:
    """Fraction of the theoretical peak (1 / track_time_vs_roofline) against prefix length."""
    return _per_heads(runs, "track_time_vs_roofline", lambda i: True, "fraction of peak",
                      f"Fraction of the roofline, {machine}", path, PERCENT_TICKS)


def plot_history(runs: list[Run], path: Path, machine: str = "") -> None:
    """The headline cases commit by commit, a column per prefix length: fraction of peak (the
    roofline's, fixed: it moves only when the kernel does, not when naive does) with FlashMLA's
    (Chain, chain tree) as the reference line, and, where a run timed FlashMLA, each kernel's
    speed as a fraction of FlashMLA's in that same run (1 = FlashMLA)."""
    q, heads, impls = grid.HEADLINE["q_len"], grid.HEADLINE["heads"], grid.HEADLINE["impls"]
    sources, prefixes = HEADLINE_SOURCES, grid.HEADLINE["prefix_lens"]
    what = f"heads {heads} ({' or '.join(sources)})"
    peak = "track_time_vs_roofline"

    def value(run, p, impl, sources):
        for cls in sources:
            points = run.grid(cls, peak)
            # Quick's points name their head count; HeadsN's, and Quick's before it covered
            # every head count (heads 64 only), do not.
            v = points.get((q, p, impl)) or points.get((heads, q, p, impl))
            if v:
                return 1 / v
        return math.nan

    def chain(run, p, impl):
        return run.grid("Chain", "track_time").get((heads, q, p, impl))

    def versus_reference(run, p, impl):
        ref, t = chain(run, p, REFERENCE), chain(run, p, impl)
        return ref / t if ref and t else math.nan

    def reference_peak(run, p):
        v = run.grid("Chain", peak).get((heads, q, p, REFERENCE))
        return 1 / v if v else math.nan

    if not any(not math.isnan(value(r, p, i, sources)) for r in runs for p in prefixes for i in impls):
        # No headline data (a CPU machine): the largest head count measured, its 3 longest prefixes.
        present = [c for c in reversed(HEADS) if any(r.grid(c, peak) for r in runs)]
        if not present:
            raise Skip(f"no {peak} results")
        sources = (present[0],)
        found = {p for r in runs for (qq, p, i) in r.grid(present[0], peak) if qq == q and i in impls}
        prefixes = tuple(sorted(found)[-3:])
        what = f"{HEADS[present[0]]} heads ({present[0]}: no headline results here)"
        if not prefixes:
            raise Skip(f"no {'/'.join(impls)} results at q_len {q}")
    rows = [r for r in runs if any(not math.isnan(value(r, p, i, sources)) or not math.isnan(reference_peak(r, p))
                                   for p in prefixes for i in impls)]
    versus = any(not math.isnan(versus_reference(r, p, i)) for r in rows for p in prefixes for i in impls)
    fig, axes = plt.subplots(2 if versus else 1, len(prefixes), squeeze=False, sharex=True, sharey="row",
                             layout="constrained", figsize=(2.5 + min(5.0, max(3.0, 0.3 * len(rows))) * len(prefixes),
                                                            7.0 if versus else 4.2))
    x = np.arange(len(rows))
    drawn = []
    for col, p in enumerate(prefixes):
        lines = [(0, i, [value(r, p, i, sources) for r in rows]) for i in impls]
        lines.append((0, REFERENCE, [reference_peak(r, p) for r in rows]))
        if versus:
            lines += [(1, i, [versus_reference(r, p, i) for r in rows]) for i in impls]
        for row, impl, ys in lines:
            if not all(math.isnan(y) for y in ys):
                axes[row][col].plot(x, ys, **impl_style(impl))
                drawn.append(impl)
        if versus:
            axes[1][col].axhline(1.0, **{**impl_style(REFERENCE), "marker": None})
            drawn.append(REFERENCE)
        axes[0][col].set_title(f"prefix {prefix_label(p)}", fontsize=9)
        for ax in axes[:, col]:
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        step = max(1, len(rows) // 12)  # keep the hash labels legible on a long history
        axes[-1][col].set_xticks(x[::step], [r.commit[:8] for r in rows][::step], rotation=60, ha="right", fontsize=7)
    axes[0][0].set_ylabel("fraction of peak")
    log_ticks(axes[0][0].yaxis, PERCENT_TICKS, *data_range(axes[0]))
    if versus:
        axes[1][0].set_ylabel(f"speed as a fraction of {REFERENCE}'s\n(same run, chain tree)")
        log_ticks(axes[1][0].yaxis, PERCENT_TICKS, *data_range(axes[1]))
    fig.supxlabel("commit (oldest to newest by commit date)", fontsize=9)
    legend_outside(fig, [handle(i) for i in ordered(set(drawn))])
    fig.suptitle(f"History, {machine}: {', '.join(impls)} at q_len {q}, {what}", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_chain(runs: list[Run], path: Path, machine: str = "") -> list[str]:
    """Achieved TFLOP/s on the chain tree (the causal mask FlashMLA also takes), a panel per
    (heads, q_len), a line per implementation against prefix length, each from the newest
    commit that timed it (a peer such as FlashMLA is not timed on every run); FlashMLA is the
    black reference line to beat."""
    newest: dict[str, Run] = {}
    for run in runs:  # oldest first: later runs overwrite
        for (_, _, _, impl) in run.grid("Chain", "track_time"):
            newest[impl] = run
    if not newest:
        raise Skip("no Chain results")
    points = {(h, q, p, i): (t, run.grid("Chain", "track_flops").get((h, q, p, i)))
              for i, run in newest.items() for (h, q, p, ii), t in run.grid("Chain", "track_time").items() if ii == i}
    panels = sorted({(h, q) for h, q, _, _ in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(2.5 + 3.0 * len(panels), 4.2), squeeze=False, sharey=True,
                             layout="constrained")
    impls = ordered(newest)
    drawn = []
    for ax, (h, q) in zip(axes[0], panels):
        prefixes = sorted({p for hh, qq, p, _ in points if (hh, qq) == (h, q)})
        for impl in impls:
            pts = [(p, fl / t / 1e12) for p in prefixes if (h, q, p, impl) in points
                   for t, fl in [points[(h, q, p, impl)]] if fl and t > 0]
            if not pts:
                continue
            ax.plot([prefixes.index(p) for p, _ in pts], [y for _, y in pts], **impl_style(impl))
            drawn.append(impl)
        ax.set_xticks(range(len(prefixes)), [prefix_label(p) for p in prefixes])
        ax.set(xlabel="prefix length", yscale="log")
        ax.set_title(f"heads {h}, q_len {q}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    if not drawn:
        plt.close(fig)
        raise Skip("no Chain results with recorded FLOPs")
    axes[0][0].set_ylabel("achieved TFLOP/s (recorded FLOPs / median time)")
    log_ticks(axes[0][0].yaxis, PLAIN_TICKS, *data_range(axes))
    legend_outside(fig, [handle(i, f"{i} @{newest[i].commit[:8]}" + (" (reference)" if i == REFERENCE else ""))
                         for i in ordered(set(drawn))])
    fig.suptitle(f"Chain tree, batch 1, {machine}: FlashMLA the black dashed reference, each line from its newest commit",
                 fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return impls


CAPTIONS = {
    "roofline": "Roofline: achieved TFLOP/s (cost-model FLOPs / median time) of each implementation at "
                "each grid point of the newest commit measured, against arithmetic intensity (FLOP per "
                "byte of the tree-aware cost model), under the machine's compute and bandwidth ceilings.",
    "speedup": "Speedup over naive = naive time / implementation time, both measured side by side in the "
               "same process, against prefix length; a line per implementation (one style each, in every plot), a "
               "panel per q_len and head count (newest commit that measured it). FlashMLA's runs time no naive.",
    "peak_fraction": "Fraction of peak = roofline time / measured time, the roofline time from the "
                     "tree-aware cost model and the machine's peaks; a line per implementation, a panel per q_len and "
                     "head count; FlashMLA (chain tree, where it ran) the black dashed reference.",
    "chain": "Chain tree (the causal mask FlashMLA also takes), batch 1: achieved TFLOP/s of each "
             "implementation against prefix length, a panel per (heads, q_len); FlashMLA, where it ran, "
             "is the dashed black reference line a kernel has to beat.",
    "history": f"History: fraction of peak of {', '.join(grid.HEADLINE['impls'])} at the headline cases (heads "
               f"{grid.HEADLINE['heads']}, q_len {grid.HEADLINE['q_len']}, prefix "
               f"{'/'.join(str(p) for p in grid.HEADLINE['prefix_lens'])}), commit by commit, with FlashMLA's (chain "
               "tree) as the black reference line; below, where a run timed FlashMLA, each kernel's speed as a "
               "fraction of FlashMLA's in the same run. Neither moves when naive does.",
}
PLOTS = {"roofline": plot_roofline, "speedup": plot_speedup, "peak_fraction": plot_peak_fraction,
         "chain": plot_chain, "history": plot_history}


def write_index(out_dir: Path, figures: list[tuple[str, str, str]], skipped: list[str]) -> Path:
    """A plain page: each figure with alt text and caption, what was not drawn, links back to the landing page and asv's grid."""
    esc = html.escape
    body = "".join(f'<figure><img src="{esc(f)}" alt="{esc(alt)}"><figcaption>{esc(cap)}</figcaption></figure>\n'
                   for f, alt, cap in figures) or "<p>No plots: no results to draw.</p>\n"
    if skipped:
        body += "<h2>Not drawn</h2><ul>" + "".join(f"<li>{esc(s)}</li>" for s in skipped) + "</ul>\n"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>verify-attn plots</title>
<link rel="icon" href="data:,">
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}}
img{{max-width:100%;border:1px solid #ddd}} figure{{margin:2em 0}} figcaption{{color:#444}}</style></head>
<body><p><a href="../index.html">&larr; Latest results</a> &middot; <a href="../asv.html">All benchmarks (asv)</a></p>
<h1>verify-attn: plots</h1>
<p>Speedup = naive time / implementation time, measured side by side in the same process.
Fraction of peak = roofline time / measured time, with the tree-aware cost model.</p>
{body}</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page)
    return path


def main(results_dir, out_dir, machine: str | None = None) -> list[Path]:
    """Draw every plot for each machine (or the one given) into out_dir, plus index.html.
    Returns the PNGs written; a plot that cannot be drawn is logged and listed as not drawn."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures, skipped, written = [], [], []
    names = [machine] if machine else machines(results_dir)
    if not names:
        skipped.append(f"no machines under {results_dir}")
    for name in names:
        try:  # a results file asv's loader or a parameter's literal trips on costs this machine only
            runs = load_runs(results_dir, name)
        except Exception as exc:  # noqa: BLE001 (publish validates the files first: this is a backstop)
            log.error("plots for %s not drawn: its results do not load (%s: %s)", name, type(exc).__name__, exc)
            skipped.append(f"{name}: results do not load ({type(exc).__name__}: {exc})")
            continue
        ceil = ceilings(runs, name)
        for kind, fn in PLOTS.items():
            path = out_dir / f"{name}-{kind}.png"
            try:
                if not runs:
                    raise Skip("no results")
                if fn is plot_roofline:
                    fn(runs, ceil, path, name)
                else:
                    fn(runs, path, name)
            except Skip as exc:
                log.warning("plot %s for %s skipped: %s", kind, name, exc)
                skipped.append(f"{name}, {kind}: {exc}")
                continue
            except Exception as exc:  # a bug in one plot must not cost the others or the site
                log.exception("plot %s for %s failed", kind, name)
                skipped.append(f"{name}, {kind}: failed ({type(exc).__name__}: {exc})")
                continue
            written.append(path)
            figures.append((path.name, f"{kind.replace('_', ' ')} plot for machine {name}",
                            f"{name}: {CAPTIONS[kind]}"))
    write_index(out_dir, figures, skipped)
    return written

