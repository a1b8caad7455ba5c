"""verify_attn_tools/plots.py, read off the matplotlib figures it draws: one style per
implementation in every plot, FlashMLA the reference line where it ran, legends outside the
data, one tick format (percent on fraction-of-peak axes), no overlapping tick labels, and a
history that does not step where naive did."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import pytest

from verify_attn import registry
from verify_attn_tools import plots

CLOSE = plt.close
SHARE = {"naive": 0.0008, "flash": 0.02, "tc": 0.4, "tc_mma": 0.3, "torch": 0.05}
CHAIN_SHARE = {"tc": 0.4, "flash": 0.02, "flashmla": 0.7}


def run(commit: str, date: int, naive_scale: float = 1.0) -> plots.Run:
    """One commit's values: Heads8/Heads64 (every implementation), Chain (with FlashMLA)."""
    values: dict = {}
    for cls, heads in (("Heads8", 8), ("Heads64", 64)):
        for q, p, impl in itertools.product((9, 33), (0, 2048, 65536), SHARE):
            share = SHARE[impl] * (1 + p / 65536)
            values.setdefault(f"bench_verify_attn.{cls}.track_time_vs_roofline", {})[(q, p, impl)] = 1 / share
            values.setdefault(f"bench_verify_attn.{cls}.track_time_vs_naive", {})[(q, p, impl)] = \
                SHARE["naive"] / share * naive_scale
            values.setdefault(f"bench_verify_attn.{cls}.track_time", {})[(q, p, impl)] = 1e-5 / share
            values.setdefault(f"bench_verify_attn.{cls}.track_flops", {})[(q, p, impl)] = 1e9 * (1 + p)
            values.setdefault(f"bench_verify_attn.{cls}.track_bytes", {})[(q, p, impl)] = 1e6 * (1 + p)
    for h, q, p, impl in itertools.product((8, 64), (9,), (2048, 65536), CHAIN_SHARE):
        share = CHAIN_SHARE[impl] * (1 + p / 65536)
        values.setdefault("bench_verify_attn.Chain.track_time", {})[(h, q, p, impl)] = 1e-5 / share
        values.setdefault("bench_verify_attn.Chain.track_flops", {})[(h, q, p, impl)] = 1e9 * (1 + p)
        values.setdefault("bench_verify_attn.Chain.track_time_vs_roofline", {})[(h, q, p, impl)] = 1 / share
    values["bench_machine.Machine.track_peak_tflops"] = {(): 784.0}
    values["bench_machine.Machine.track_peak_gbps"] = {(): 4170.0}
    return plots.Run(commit * 40, date, values)


RUNS = [run("a", 1), run("b", 2, naive_scale=1.27), run("c", 3)]  # naive 27% slower at b (0e15fd2's chunked keys)


@pytest.fixture
def figures(monkeypatch, tmp_path):
    """Draw every plot, keeping its figure open for inspection instead of closing it."""
    kept = {}
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: None)
    for kind, fn in plots.PLOTS.items():
        before = set(plt.get_fignums())
        args = (RUNS, plots.ceilings(RUNS, "nvidia-h200")) if fn is plots.plot_roofline else (RUNS,)
        fn(*args, tmp_path / f"{kind}.png", "nvidia-h200")
        (num,) = set(plt.get_fignums()) - before
        kept[kind] = plt.figure(num)
        kept[kind].canvas.draw()
    yield kept
    CLOSE("all")


def lines_by_impl(fig) -> dict:
    """{legend label: (colour, line style, marker)} of the figure's legend entries."""
    (legend,) = fig.legends
    return {t.get_text().split(" ")[0]: (h.get_color(), str(h.get_linestyle()), h.get_marker())
            for t, h in zip(legend.get_texts(), legend.legend_handles)
            if t.get_text().split(" ")[0] in registry.IMPLS and "(= 1)" not in t.get_text()}


def test_one_style_per_implementation_in_every_plot(figures):
    marks, lines = {}, {}
    for kind, fig in figures.items():
        drawn = lines_by_impl(fig)
        assert len(drawn) >= 3 and len(set(drawn.values())) == len(drawn), (kind, drawn)  # distinct within a plot
        for impl, (colour, ls, marker) in drawn.items():
            marks.setdefault(impl, set()).add((colour, marker))
            if kind != "roofline":  # points only
                lines.setdefault(impl, set()).add((colour, ls))
    assert all(len(v) == 1 for v in marks.values()) and all(len(v) == 1 for v in lines.values()), (marks, lines)
    known = [i for i in registry.IMPLS if i != plots.REFERENCE]
    every = [plots.impl_style(i) for i in known]
    assert len({(s["color"], str(s["ls"]), s["marker"]) for s in every}) == len(known)
    assert len({str(s["ls"]) for s in every}) == len(known) and len({s["marker"] for s in every}) == len(known)


def test_flashmla_is_the_reference_wherever_it_ran(figures):
    for kind in ("roofline", "peak_fraction", "chain", "history"):
        labels = [t.get_text() for t in figures[kind].legends[0].get_texts()]
        assert any(l.startswith("flashmla") and "reference" in l for l in labels), (kind, labels)
    ref = plots.impl_style("flashmla")
    drawn = [l for ax in figures["chain"].axes for l in ax.get_lines() if l.get_marker() == ref["marker"]]
    assert drawn and all(l.get_color() == "k" and l.get_linewidth() == ref["lw"] for l in drawn)


def test_legends_are_outside_the_data(figures):
    for kind, fig in figures.items():
        assert not any(ax.get_legend() for ax in fig.axes), kind
        (legend,) = fig.legends
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), (kind, box, ax.get_window_extent())


def visible_labels(axis):
    lo, hi = sorted(axis.get_view_interval())
    return [(t, t.get_text()) for t in axis.get_ticklabels(which="both")
            if t.get_visible() and t.get_text() and lo <= (t.get_position()[1] if axis.axis_name == "y" else t.get_position()[0]) <= hi]


@pytest.mark.parametrize("kind, suffix", [("peak_fraction", "%"), ("history", "%"), ("speedup", "x"),
                                          ("chain", ""), ("roofline", "")])
def test_ticks_one_format_none_overlapping(figures, kind, suffix):
    fig = figures[kind]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if ax.get_yscale() != "log":
            continue
        labels = visible_labels(ax.yaxis)
        if ax.yaxis.get_tick_params()["labelleft"] is False or not labels:
            continue
        texts = [text for _, text in labels]
        assert len(texts) >= 2, (kind, texts)
        assert all("e" not in t and "^" not in t and t.endswith(suffix) for t in texts), (kind, texts)
        if suffix == "":
            assert all(t[-1].isdigit() for t in texts), (kind, texts)
        boxes = [t.get_window_extent(renderer) for t, _ in labels]
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), (kind, texts)
        assert isinstance(ax.yaxis.get_minor_formatter(), plots.NullFormatter), kind


def test_history_does_not_step_where_naive_did(figures):
    """Naive 27% slower at commit b: every history line is flat across it (fraction of peak and
    the speed as a fraction of FlashMLA's, measured in the same run)."""
    fig = figures["history"]
    checked = 0
    for ax in fig.axes:
        for line in ax.get_lines():
            ys = [y for y in line.get_ydata() if y == y]
            if len(ys) == 3:
                assert max(ys) / min(ys) == pytest.approx(1.0), (ax.get_ylabel(), line.get_label(), ys)
                checked += 1
    assert checked >= 2 * 5  # tc, flash, flashmla on top and tc, flash below, at both prefixes measured
    assert sum(ax.get_ylabel().startswith("speed as a fraction of flashmla") for ax in fig.axes) == 1


def test_speedup_draws_the_baseline_as_the_line_at_one(figures):
    labels = [t.get_text() for t in figures["speedup"].legends[0].get_texts()]
    assert "naive (= 1)" in labels and "naive" not in labels


def test_the_way_back_names_the_page_it_opens(tmp_path):
    """The site's first page is the landing page (index.html), asv's own grid is asv.html: each
    link back from the plots says which one it opens."""
    import re

    page = plots.write_index(tmp_path, [], []).read_text()
    links = dict(re.findall(r'<a href="([^"]+)">([^<]+)</a>', page))
    assert links == {"../index.html": "&larr; Latest results", "../asv.html": "All benchmarks (asv)"}
