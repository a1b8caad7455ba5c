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
from matplotlib.ticker import FuncFormatter, LogFormatter  # noqa: E402
from verify_attn import grid, registry  # noqa: E402

log = logging.getLogger("verify_attn.plots")

BENCH = "bench_verify_attn"
# The full grids, whose head count is in the name. Quick is a few points a head count, ColdL2
# another cache state: neither is mixed into the per-heads plots.
HEADS = {f"Heads{h}": h for h in grid.HEADS}
HEADS_MARKERS = "os^Dvp"
HISTORY_MARKERS = "os^Dv"  # one an implementation in the history plot
# Pull requests run only Quick, which measures the headline points on a GPU, so it fills in
# for the full grid's class at the headline's head count.
HEADLINE_SOURCES = (f"Heads{grid.HEADLINE['heads']}", "Quick")


def style(impl: str) -> str:
    """Line style: dotted for the baseline, solid for the kernels under test, dashed for peers."""
    entry = registry.IMPLS.get(impl)
    if entry is None or not entry.under_test:
        return "--"
    return ":" if entry.baseline else "-"


def marker(heads: int) -> str:
    return HEADS_MARKERS[sorted(HEADS.values()).index(heads) % len(HEADS_MARKERS)] if heads in HEADS.values() else "x"


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


def plot_roofline(runs: list[Run], ceil: Ceilings | None, path: Path, machine: str = "") -> None:
    """Achieved TFLOP/s against arithmetic intensity (log-log) under the machine's ceilings."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    xs = []
    for cls, heads in HEADS.items():
        found = latest(runs, cls, "track_time")
        if not found:
            continue
        run, times = found
        for impl in ordered(i for _, _, i in times):
            pts = [(point_cost(run, cls, heads, key), t) for key, t in sorted(times.items()) if key[2] == impl and t > 0]
            if not pts:
                continue
            x = [f / b for (f, b), _ in pts]
            xs += x
            ax.scatter(x, [f / t / 1e12 for (f, _), t in pts], color=registry.color(impl), marker=marker(heads),
                       label=f"{impl}, {heads} heads @{run.commit[:8]}", alpha=0.85)
    if not xs:
        plt.close(fig)
        raise Skip("no track_time results of Heads8/16/64")
    note = ""
    if ceil:
        # The roof: bandwidth-bound left of the ridge, compute-bound right of it.
        ridge = ceil.tflops * 1e3 / ceil.gbps
        lo, hi = min(min(xs), ridge) / 2, max(max(xs), ridge) * 2
        ax.plot([lo, ridge], [ceil.gbps * lo / 1e3, ceil.tflops], "k:", label=f"bandwidth ceiling {ceil.gbps:.0f} GB/s")
        ax.plot([ridge, hi], [ceil.tflops, ceil.tflops], "k--", label=f"compute ceiling {ceil.tflops:.0f} TFLOP/s")
        note = f"ceilings {ceil.source}"
    else:
        note = "no ceilings: no peaks recorded or known for this machine"
        log.warning("%s roofline: %s", machine, note)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte, tree-aware cost model)",
           ylabel="achieved TFLOP/s", title=f"Roofline, {machine}\n({note})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _per_heads(runs: list[Run], metric: str, impls, ylabel: str, title: str, path: Path,
               scale: float = 1.0, ref: float | None = None) -> list[str]:
    """1 / metric against prefix length, a panel per head count (its newest commit), a line
    per (q_len, impl). Returns the implementations drawn."""
    panels = [(heads, found) for cls, heads in HEADS.items() if (found := latest(runs, cls, metric))]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(0.5 + 4.5 * max(1, len(panels)), 4.2),
                             squeeze=False, sharey=True)
    q_lens = sorted({q for _, (_, g) in panels for q, _, _ in g})  # one colour per q_len throughout
    impls = ordered(i for _, (_, g) in panels for _, _, i in g if impls(i))
    drawn = 0
    for ax, (heads, (run, g)) in zip(axes[0], panels):
        # Prefix lengths as categories: they include 0, which a log axis cannot show.
        prefixes = sorted({p for _, p, _ in g})
        for n, q in enumerate(q_lens):
            for impl in impls:
                pts = sorted((p, scale / v) for (qq, p, i), v in g.items() if qq == q and i == impl and v > 0)
                if pts:
                    drawn += 1
                    ax.plot([prefixes.index(p) for p, _ in pts], [y for _, y in pts], color=f"C{n}",
                            ls=style(impl), marker="o", ms=4)
        ax.set_xticks(range(len(prefixes)), [str(p) for p in prefixes])
        ax.set(xlabel="prefix length", yscale="log", title=f"{heads} heads @{run.commit[:8]}")
        if ref is not None:
            ax.axhline(ref, color="k", lw=0.8)
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(LogFormatter(labelOnlyBase=False))  # 0.6, 2, 30: not 6x10^-1 on a short range
        ax.grid(True, which="both", alpha=0.3)
    if not drawn:
        plt.close(fig)
        raise Skip(f"no {metric} results in Heads{'/'.join(str(h) for h in HEADS.values())}")
    axes[0][0].set_ylabel(ylabel)
    # Colour = q_len, line style = implementation: a short legend instead of one entry per line.
    handles = [Line2D([], [], color=f"C{n}", marker="o", ms=4, label=f"q_len {q}") for n, q in enumerate(q_lens)]
    handles += [Line2D([], [], color="k", ls=style(i), label=i) for i in impls]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return impls


def plot_speedup(runs: list[Run], path: Path, machine: str = "") -> list[str]:
    """Speedup over naive (1 / track_time_vs_naive) against prefix length."""
    base = registry.baseline()
    return _per_heads(runs, "track_time_vs_naive", lambda i: i != base, f"speedup over {base} (x)",
               f"Speedup over naive, {machine} (line at 1 = naive)", path, ref=1.0)


def plot_peak_fraction(runs: list[Run], path: Path, machine: str = "") -> list[str]:
    """Fraction of the theoretical peak (1 / track_time_vs_roofline) against prefix length."""
    return _per_heads(runs, "track_time_vs_roofline", lambda i: True, "% of peak",
               f"Fraction of the roofline, {machine}", path, scale=100.0)


def plot_history(runs: list[Run], path: Path, machine: str = "") -> None:
    """Speedup and fraction of peak at the headline cases, commit by commit: a colour per
    prefix length, a line style per headline implementation."""
    q, impls = grid.HEADLINE["q_len"], grid.HEADLINE["impls"]
    sources, prefixes = HEADLINE_SOURCES, grid.HEADLINE["prefix_lens"]
    what = f"heads {grid.HEADLINE['heads']} ({' or '.join(sources)})"

    def value(run, metric, p, impl, sources):
        for cls in sources:
            points = run.grid(cls, metric)
            # Quick's points name their head count; HeadsN's, and Quick's before it covered
            # every head count (heads 64 only), do not.
            v = points.get((q, p, impl)) or points.get((grid.HEADLINE["heads"], q, p, impl))
            if v:
                return 1 / v
        return math.nan

    def has_any(sources, prefixes):
        return any(not math.isnan(value(r, "track_time_vs_naive", p, i, sources))
                   for r in runs for p in prefixes for i in impls)

    if not has_any(sources, prefixes):
        # No headline data (a CPU machine): the largest head count measured, its 3 longest prefixes.
        present = [c for c in reversed(HEADS) if any(r.grid(c, "track_time_vs_naive") for r in runs)]
        if not present:
            raise Skip("no track_time_vs_naive results")
        sources = (present[0],)
        found = {p for r in runs for (qq, p, i) in r.grid(present[0], "track_time_vs_naive") if qq == q and i in impls}
        prefixes = tuple(sorted(found)[-3:])
        what = f"{HEADS[present[0]]} heads ({present[0]}: no headline results here)"
        if not prefixes:
            raise Skip(f"no {'/'.join(impls)} results at q_len {q}")
    metrics = ("track_time_vs_naive", "track_time_vs_roofline")
    rows = [r for r in runs if any(not math.isnan(value(r, m, p, i, sources))
                                   for m in metrics for p in prefixes for i in impls)]
    fig, axes = plt.subplots(2, 1, figsize=(min(16.0, max(6.0, 1.0 + 0.45 * len(rows))), 6.5), sharex=True)
    x = np.arange(len(rows))
    for ax, metric, label in ((axes[0], metrics[0], f"speedup over {registry.baseline()} (x)"),
                              (axes[1], metrics[1], "fraction of peak")):
        for k, impl in enumerate(impls):
            for n, p in enumerate(prefixes):
                ys = [value(r, metric, p, impl, sources) for r in rows]
                if not all(math.isnan(y) for y in ys):
                    ax.plot(x, ys, marker=HISTORY_MARKERS[k % len(HISTORY_MARKERS)], color=f"C{n}", ls=style(impl),
                            label=f"{impl}, prefix {p}")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    for axis in (axes[0].yaxis.set_major_formatter, axes[0].yaxis.set_minor_formatter):
        axis(LogFormatter(labelOnlyBase=False))
    percent = FuncFormatter(lambda v, _: f"{100 * v:.2g}%")
    axes[1].yaxis.set_major_formatter(percent)
    axes[1].yaxis.set_minor_formatter(percent)
    step = max(1, len(rows) // 30)  # keep the hash labels legible on a long history
    axes[1].set_xticks(x[::step], [r.commit[:8] for r in rows][::step], rotation=45, ha="right", fontsize=8)
    axes[1].set_xlabel("commit (oldest to newest by commit date)")
    fig.suptitle(f"History, {machine}: {', '.join(impls)} at q_len {q}, {what}", fontsize=10)
    fig.tight_layout()
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
    fig, axes = plt.subplots(1, len(panels), figsize=(0.5 + 3.6 * len(panels), 4.2), squeeze=False, sharey=True)
    impls = ordered(newest)
    for ax, (h, q) in zip(axes[0], panels):
        prefixes = sorted({p for hh, qq, p, _ in points if (hh, qq) == (h, q)})
        for impl in impls:
            pts = [(p, fl / t / 1e12) for p in prefixes if (h, q, p, impl) in points
                   for t, fl in [points[(h, q, p, impl)]] if fl and t > 0]
            if not pts:
                continue
            ref = impl == "flashmla"
            ax.plot([prefixes.index(p) for p, _ in pts], [y for _, y in pts], marker="o", ms=4, lw=2.5 if ref else 1.5,
                    color="k" if ref else registry.color(impl), ls="--" if ref else style(impl),
                    label=f"{impl} @{newest[impl].commit[:8]}")
        ax.set_xticks(range(len(prefixes)), [str(p) for p in prefixes])
        ax.set(xlabel="prefix length", yscale="log", title=f"heads {h}, q_len {q}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("achieved TFLOP/s (recorded FLOPs / median time)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"Chain tree, batch 1, {machine} (FlashMLA: black, dashed; each line from its newest commit)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return impls


CAPTIONS = {
    "roofline": "Roofline: achieved TFLOP/s (cost-model FLOPs / median time) of each implementation at "
                "each grid point of the newest commit measured, against arithmetic intensity (FLOP per "
                "byte of the tree-aware cost model), under the machine's compute and bandwidth ceilings.",
    "speedup": "Speedup over naive = naive time / implementation time, both measured side by side in the "
               "same process, against prefix length; a line per q_len and implementation, a panel per "
               "head count (newest commit that measured it).",
    "peak_fraction": "Fraction of peak = roofline time / measured time, the roofline time from the "
                     "tree-aware cost model and the machine's peaks; a line per q_len and implementation.",
    "chain": "Chain tree (the causal mask FlashMLA also takes), batch 1: achieved TFLOP/s of each "
             "implementation against prefix length, a panel per (heads, q_len); FlashMLA, where it ran, "
             "is the dashed black reference line a kernel has to beat.",
    "history": f"History: speedup over naive and fraction of peak of {', '.join(grid.HEADLINE['impls'])} at the "
               f"headline cases (heads {grid.HEADLINE['heads']}, q_len {grid.HEADLINE['q_len']}, prefix "
               f"{'/'.join(str(p) for p in grid.HEADLINE['prefix_lens'])}), commit by commit.",
}
PLOTS = {"roofline": plot_roofline, "speedup": plot_speedup, "peak_fraction": plot_peak_fraction,
         "chain": plot_chain, "history": plot_history}


def write_index(out_dir: Path, figures: list[tuple[str, str, str]], skipped: list[str]) -> Path:
    """A plain page: each figure with alt text and caption, what was not drawn, a way back."""
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
<body><p><a href="../index.html">&larr; asv benchmark site</a></p>
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

