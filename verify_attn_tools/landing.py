"""The site's first page (html/index.html): per tracked machine, the newest measured commit
against the one before it at the headline points, in one table a kernel engineer reads in
30 seconds.

Per point (tc, tc_mma, flash, naive and the peers torch and FlashMLA at the Chain and Serving
shapes, and Quick's, the pull-request gate): the time, the speedup over naive and the share of
the roofline (both recorded with the run, track_time_vs_naive and _vs_roofline), the time over
FlashMLA's at the same shape, and the change since the previous commit with its verdict. The
verdict is report's (verify_attn_tools/report.py: compare and markdown, imported, not copied):
judged on the drift-free series track_time_vs_anchor, asv's Mann-Whitney test and a factor of
1.03; where one of the two commits lacks that series the change shows as raw only, not judged. A
trend line per point (every recorded commit's time) links to the point's asv graph, the
verdict to the commit. Under Quick's rows, where the newest commit has the profiler's series
(benchmarks/bench_profile.py), the hardware's view of that call and what moved since the
previous commit's profile (hardware()); without them the page says the commit was not
profiled. Static HTML with its style inline: no script, no network, nothing fetched; every
value from a results file is HTML-escaped.
"""

from __future__ import annotations

import html as htmllib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from . import regressions, report

BENCH = report.BENCH
ASV_PAGE = "asv.html"  # asv's own front page, moved aside by publish
# (class, {parameter: value}): the shapes the page leads with, the first one the headline.
HEADLINE = (
    ("Chain", {"heads": 64, "q_len": 9, "prefix_len": 65536}),
    ("Chain", {"heads": 64, "q_len": 9, "prefix_len": 16384}),
    ("Chain", {"heads": 64, "q_len": 9, "prefix_len": 2048}),
    ("Chain", {"heads": 64, "q_len": 65, "prefix_len": 65536}),
    ("Serving", {"batch": 32, "heads": 64, "q_len": 9}),
    ("Serving", {"batch": 8, "heads": 64, "q_len": 9}),
    ("ServingChain", {"batch": 32, "heads": 64, "q_len": 9}),
    ("ServingChain", {"batch": 8, "heads": 16, "q_len": 9}),
    ("Quick", {"heads": 64, "q_len": 9, "prefix_len": 65536}),
)
IMPLS = ("tc", "tc_mma", "tc_wgmma", "flashmla", "flash", "torch", "naive")  # row order within a shape
REFERENCE = "flashmla"


def esc(value) -> str:
    return htmllib.escape(str(value), quote=True)


@dataclass
class Point:
    cls: str
    shape: dict
    impl: str
    ms: float | None = None            # newest commit's median time, ms
    speedup: float | None = None       # over naive, same process
    peak: float | None = None          # fraction of the roofline
    vs_reference: float | None = None  # time over FlashMLA's at this shape
    row: report.Row | None = None      # report's comparison with the previous commit
    trend: list = field(default_factory=list)  # [(commit, seconds)] oldest first
    graph: str = ""                    # the asv graph page of the point
    hardware: str = ""                 # the profiler's view at the newest commit and what moved (hardware())

    @property
    def case(self) -> str:
        return report.label(self.cls, list(self.shape), tuple(self.shape.values()))[0]


@dataclass
class Machine:
    name: str
    commits: list                      # [(sha, date ms)] oldest first, those with results
    points: list
    code: int | None = None            # report's exit code for the whole suite: 0, 1 slower, 2 failed
    summary: str = ""
    ceilings: str = ""
    profiled: bool = False             # the newest commit has profiler series (bench_profile)
    judged: int = 0                    # counted points judged on the drift-free series


def results_files(results_dir: Path, machine: str) -> list[tuple[str, int]]:
    """[(commit sha, date)] of a machine's results files, oldest first (asv orders by date)."""
    out = []
    for path in (results_dir / machine).glob("*.json"):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        out.append((data["commit_hash"], data["date"]))
    return sorted(out, key=lambda c: c[1])


MACHINE_SUITE = "bench_machine"  # unparametrized series of the machine: ceilings, driver, clocks


def machine_values(res: dict) -> dict[str, float]:
    """{benchmark: value} of the machine series in a commit's loaded results."""
    out = {}
    for key, (_, pts) in res.items():
        v = pts.get((), (None,))[0]
        if key.startswith(f"{MACHINE_SUITE}.") and isinstance(v, (int, float)) and not report.isna(v):
            out[key] = float(v)
    return out


def machine_details(res: dict) -> dict[str, str]:
    """{what: description} of a machine from a commit's loaded results (report.load with
    MACHINE_SUITE): its recorded machine series and the SM clocks sampled during its timings
    (track_sm_clock). The landing page's machine line and the machine's tooltip on asv's graph
    pages."""
    recorded = machine_values(res)
    # The timer's clocks only: the profiler's series (bench_profile) is ncu's locked replay clock.
    clocks = [v for k, (_, pts) in res.items() if k.endswith(".track_sm_clock") and k.startswith(f"{report.BENCH}.")
              for (v, _, _) in pts.values() if not report.isna(v)]
    out = {}
    tf = recorded.get(f"{MACHINE_SUITE}.Machine.track_peak_tflops")
    bw = recorded.get(f"{MACHINE_SUITE}.Machine.track_peak_gbps")
    if tf is not None and bw is not None:
        out["ceilings"] = f"{tf:.0f} TFLOP/s, {bw / 1e3:.2f} TB/s (bench_machine.Machine)"
    if clocks:
        clocks = sorted(clocks)
        out["SM clock while timing"] = (f"median {clocks[len(clocks) // 2]:.0f} MHz over {len(clocks)} points "
                                        f"({clocks[0]:.0f}-{clocks[-1]:.0f}, track_sm_clock)")
    gpu = {f: recorded.get(f"{MACHINE_SUITE}.Gpu.track_{f}")
           for f in ("driver_version", "cuda_version", "sm_count", "max_sm_clock", "app_sm_clock", "power_limit")}
    if gpu["driver_version"] is None:
        out["driver, CUDA and clocks"] = "not recorded at this commit (bench_machine.Gpu)"
    else:
        out["driver"] = f"{gpu['driver_version']:g}"
        if gpu["cuda_version"] is not None:
            out["CUDA"] = f"{gpu['cuda_version']:.1f}"
        if gpu["sm_count"] is not None:
            out["SMs"] = f"{gpu['sm_count']:.0f}"
        if gpu["max_sm_clock"] is not None:
            out["SM clock"] = f"max {gpu['max_sm_clock']:.0f} MHz" + (
                f" (application {gpu['app_sm_clock']:.0f})" if gpu["app_sm_clock"] is not None else "")
        if gpu["power_limit"] is not None:
            out["power limit"] = f"{gpu['power_limit']:.0f} W (bench_machine.Gpu)"
    return out


PROFILE_SUITE = "bench_profile"  # Nsight Compute's counters at Quick's points (benchmarks/bench_profile.py)
PROFILED = "Quick"  # the landing's class whose points the profile shares (heads, q_len, prefix_len, impl)
# The moves a glance names since the previous commit's profile; smaller ones go unnamed (descriptive
# series, not a verdict): a % of peak by 2 points, the DRAM bandwidth by 3%, the SM tail by 0.02 (as
# shown, two decimals), a count by any.
MOVED_POINTS, MOVED_SHARE, MOVED_TAIL = 2.0, 0.03, 0.02
PERCENTS = (("track_dram_pct", "DRAM"), ("track_tensor_pipe_pct", "tensor pipe"), ("track_issue_pct", "issue slots"),
            ("track_occupancy_pct", "occupancy"))
COUNTS = (("track_registers", "registers", 1), ("track_dynamic_smem_bytes", "KiB dynamic smem", 1024),
          ("track_kernels", "kernels", 1))


def profile_values(res: dict) -> dict[tuple, dict[str, float]]:
    """{(heads, q_len, prefix_len, impl): {series: value}} of the profiler's series in a commit's
    loaded results (n/a left out)."""
    out: dict[tuple, dict[str, float]] = {}
    prefix = f"{PROFILE_SUITE}.Profile."
    for key, (_, pts) in res.items():
        if key.startswith(prefix):
            for combo, (v, _, _) in pts.items():
                if isinstance(v, (int, float)) and not report.isna(v):
                    out.setdefault(combo, {})[key[len(prefix):]] = float(v)
    return out


def top_stall(call: dict) -> tuple[str, float] | None:
    stalls = {k: v for k, v in call.items() if k.startswith("track_stall_")}
    if not stalls:
        return None
    top = max(stalls, key=stalls.get)
    return top[len("track_stall_"):].replace("_", " "), stalls[top]


def count_moved(words: str, scale: int, a: float, b: float) -> str:
    """"registers 168→176", "KiB dynamic smem 118→120"; in the recorded units where the scaled
    values round alike ("dynamic smem 224,908→224,924 bytes"), so that a change never reads as none."""
    if round(a / scale) != round(b / scale):
        return f"{words} {a / scale:.0f}→{b / scale:.0f}"
    return f"{words.removeprefix('KiB ')} {a:,.0f}→{b:,.0f} bytes"


def moved(new: dict, old: dict) -> list[str]:
    """What moved past the glance's thresholds between two profiles of one point."""
    out = []
    a, b = old.get("track_dram_gbps"), new.get("track_dram_gbps")
    if a and b and abs(b / a - 1) >= MOVED_SHARE:
        out.append(f"DRAM {a:,.0f}→{b:,.0f} GB/s ({100 * (b / a - 1):+.1f}%)")
    for series, words in PERCENTS:
        a, b = old.get(series), new.get(series)
        if a is not None and b is not None and abs(b - a) >= MOVED_POINTS:
            out.append(f"{words} {a:.0f}→{b:.0f}%")
    for series, words, scale in COUNTS:
        a, b = old.get(series), new.get(series)
        if a is not None and b is not None and a != b:
            out.append(count_moved(words, scale, a, b))
    a, b = old.get("track_sm_tail"), new.get("track_sm_tail")
    if a is not None and b is not None and abs(round(100 * b) - round(100 * a)) >= round(100 * MOVED_TAIL):
        out.append(f"SM tail {a:.2f}→{b:.2f}x")
    a, b = top_stall(old), top_stall(new)
    if a and b and a[0] != b[0]:
        out.append(f"top stall {a[0]}→{b[0]}")
    return out


def hardware(new: dict, old: dict | None, old_sha: str | None) -> str:
    """The profiler's view of one point at the newest commit, then what moved since the previous
    commit's profile of it (old None: that commit has none; old_sha None: no previous commit)."""
    parts = []
    if "track_dram_gbps" in new:
        pct = new.get("track_dram_pct")
        parts.append(f"DRAM {new['track_dram_gbps']:,.0f} GB/s" + (f" ({pct:.0f}% of peak)" if pct is not None else ""))
    parts += [f"{words} {new[series]:.0f}%" for series, words in PERCENTS[1:] if series in new]
    parts += [f"{new[series] / scale:.0f} {words}" for series, words, scale in COUNTS[:2] if series in new]
    if "track_sm_tail" in new:
        parts.append(f"SM tail {new['track_sm_tail']:.2f}x")
    top = top_stall(new)
    if top:
        parts.append(f"top stall {top[0]} ({top[1]:.2f} warps/issue)")
    text = "; ".join(parts) or "profiled, no figure recorded"
    if old_sha is None:
        return text
    if old is None:
        return f"{text}. No profile at {old_sha[:8]}"
    moves = moved(new, old)
    return f"{text}. Since {old_sha[:8]}: {', '.join(moves)}" if moves else f"{text}. Nothing moved since {old_sha[:8]}"


def value(res: dict, cls: str, metric: str, combo: tuple):
    v = res.get(f"{BENCH}.{cls}.{metric}", (None, {}))[1].get(combo, report.NA)[0]
    return None if report.isna(v) else v


def param_string(v) -> str:
    """A parameter value as asv stores and selects it (its repr)."""
    return repr(v)


def graph_url(machine: str, cls: str, shape: dict, impl: str, metric: str = "track_time") -> str:
    params = [("machine", machine)] + [(f"p-{k}", param_string(v)) for k, v in shape.items()] + \
        [("p-impl", param_string(impl))]
    return f"{ASV_PAGE}#{BENCH}.{cls}.{metric}?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}"
                                                            for k, v in params)


def change_words(row: report.Row | None) -> tuple[str, str]:
    """(words, css class) of a row's change: "1.32x faster", "1.8% slower", "no significant change"."""
    if row is None:
        return "-", "na"
    if row.change == "new":
        return "first measured", "na"
    if row.change in ("failed", "still failing", "gone", "fixed"):
        return report.STATUS[row.change].strip("*"), "bad" if "fail" in row.change else "na"
    r = row.ratio
    if r is None or r <= 0:
        return report.STATUS[row.change], "na"
    amount = report.change_words(r)
    if row.change == "raw":
        return f"{amount} (raw only, not judged)", "na"
    if row.change == "same":
        return f"no significant change (x anchor {r:.3f})", "ok"
    peer = "" if report.counts(row.impl) else " (peer, not counted)"
    return f"{amount}{peer}", ("bad" if row.change == "slower" else "good") if not peer else "na"


def timed_impls(benchmarks: dict, cls: str) -> set[str] | None:
    """The implementations the suite times in a class: its impl parameter in benchmarks.json
    (verify_attn.grid leaves out those only gated there, GATED_ONLY, and those a selection
    excludes). None where benchmarks.json lacks the class."""
    entry = benchmarks.get(f"{BENCH}.{cls}.track_time", {})
    params = dict(zip(entry.get("param_names", []), entry.get("params", [])))
    if "impl" not in params:
        return None
    return {i.strip("'\"") for i in params["impl"]}


def tally(counted: list) -> str:
    """The points behind the verdict in report's terms: counted points (the kernels under test,
    measured in both commits), those of them judged on the drift-free series, and raw only."""
    decided = sum(r.change not in ("new", "gone") for r in counted)
    raw = sum(r.change == "raw" for r in counted)
    judged = report.judged_words(decided, sum(r.judged for r in counted))
    return f"{decided} counted points{judged}{' on the drift-free series' if judged else ''}" + (
        f"; {raw} raw only, not judged" if raw else "")


def machine_page(results_dir: Path, name: str, benchmarks: dict) -> Machine:
    commits = results_files(results_dir, name)
    loaded = [report.load(results_dir, name, sha, (BENCH, MACHINE_SUITE, PROFILE_SUITE)) for sha, _ in commits]
    profiles = [profile_values(res) for res in loaded[-2:]]  # the newest commit's and the one before
    details = machine_details(loaded[-1]) if loaded else {}
    loaded = [{k: v for k, v in res.items() if k.startswith(f"{BENCH}.")} for res in loaded]
    new = loaded[-1] if loaded else {}
    old = loaded[-2] if len(loaded) > 1 else {}
    # The steps accepted between the two newest recorded commits (this repository's history).
    accepted = regressions.accepted_between(report.ROOT, commits[-2][0], commits[-1][0]) if len(commits) > 1 else []
    rows = report.compare(old, new, benchmarks, report.FACTOR, "", accepted) if new else []
    by_point = {(r.case, r.impl): r for r in rows}
    points = []
    for cls, shape in HEADLINE:
        ref = value(new, cls, "track_time", (*shape.values(), REFERENCE))
        timed = timed_impls(benchmarks, cls)
        for impl in IMPLS:
            combo = (*shape.values(), impl)
            t = value(new, cls, "track_time", combo)
            trend = [(sha, v) for (sha, _), res in zip(commits, loaded)
                     if (v := value(res, cls, "track_time", combo)) is not None]
            # Untimed at the newest commit: a row only while the suite still times it there (a
            # failure to show); one an older suite timed would be all "-" and an empty graph.
            if t is None and (not trend or timed is not None and impl not in timed):
                continue
            naive, roof = value(new, cls, "track_time_vs_naive", combo), value(new, cls, "track_time_vs_roofline", combo)
            p = Point(cls, shape, impl, t * 1e3 if t is not None else None,
                      1 / naive if naive else None, 1 / roof if roof else None,
                      t / ref if t is not None and ref else None, trend=trend,
                      graph=graph_url(name, cls, shape, impl))
            p.row = by_point.get((p.case, impl))
            if cls == PROFILED and combo in (profiles[-1] if profiles else {}):
                before = profiles[0] if len(profiles) > 1 else None
                p.hardware = hardware(profiles[-1][combo], before.get(combo) if before is not None else None,
                                      commits[-2][0] if before is not None else None)
            points.append(p)
    m = Machine(name, commits, points, profiled=bool(profiles and profiles[-1]))
    if len(commits) > 1:
        _, m.code = report.markdown(rows, commits[-2][0], commits[-1][0], name, report.FACTOR, True)
        counted = [r for r in rows if report.counts(r.impl)]
        slower = [r for r in counted if r.change == "slower" and not r.accepted]
        stepped = [r for r in counted if r.accepted]
        faster = [r for r in counted if r.change == "faster"]
        m.judged = sum(r.judged for r in counted)
        m.summary = ("failed: something failed that did not before" if m.code == 2 else
                     f"slower at {len(slower)} points (worst {change_words(max(slower, key=lambda r: r.ratio))[0]})"
                     if slower else f"faster at {len(faster)} points, no counted slowdown" if faster else
                     "no significant change" if m.judged else
                     "not judged: the previous commit has no drift-free series (raw times only)")
        if stepped:
            m.summary += (f"; slower at {len(stepped)} points as accepted in benchmarks/accepted.json "
                          f"(worst {change_words(max(stepped, key=lambda r: r.ratio))[0]})")
        m.summary += f" ({tally(counted)})"
    m.ceilings = "; ".join(f"{k} {v}" for k, v in details.items())
    return m


def sparkline(trend: list, width: int = 96, height: int = 22) -> str:
    """An inline SVG of the times, oldest left; log scale where they span more than 3x."""
    vals = [v for _, v in trend if v and v > 0]
    if len(vals) < 2:
        return ""
    log = max(vals) / min(vals) > 3
    ys = [math.log(v) if log else v for v in vals]
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or 1.0
    pts = [(2 + i * (width - 4) / (len(ys) - 1), height - 2 - (y - lo) / span * (height - 4)) for i, y in enumerate(ys)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    x, y = pts[-1]
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="time over {len(vals)} commits"><polyline points="{line}" fill="none" stroke="#3367d6" '
            f'stroke-width="1.5"/><circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#d33"/></svg>')


def fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def commit_link(sha: str, commit_url: str | None, text: str | None = None) -> str:
    text = esc(text or sha[:8])
    return f'<a href="{esc(commit_url + sha)}">{text}</a>' if commit_url else f"<code>{text}</code>"


def compare_url(a: str, b: str, commit_url: str | None) -> str | None:
    if not commit_url:
        return None
    if "//github.com/" in commit_url and commit_url.endswith("/commit/"):
        return f"{commit_url[:-len('commit/')]}compare/{a}...{b}"
    return commit_url + b


CSS = """
body{font:15px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:0 .8em;
color:#222}
h1{font-size:1.35em;margin:.6em 0 .2em}h2{font-size:1.15em;margin:1.2em 0 .2em}
nav a{margin-right:1em;font-weight:600}.meta{color:#555;font-size:.9em;margin:.2em 0}
.glance{background:#f4f7fb;border:1px solid #d6e0ee;border-radius:6px;padding:.5em .8em;margin:.6em 0}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.92em;min-width:100%}
th,td{padding:.25em .45em;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#fafafa;position:sticky;top:0}td.l,th.l{text-align:left}
tr.shape td{background:#eef2f7;font-weight:600;text-align:left}
.ok{color:#27632a}.good{color:#0b6b0b;font-weight:600}.bad{color:#b00020;font-weight:700}.na{color:#666}
.spark{vertical-align:middle}td.v{white-space:normal;min-width:12em;text-align:left}
tr.hw td{border-bottom:1px solid #e4e4e4;color:#444;font-size:.88em;padding-top:0}
@media (max-width:600px){body{font-size:14px;padding:0 .4em}th,td{padding:.2em .3em}.hide-sm{display:none}}
"""


def render(machines: list[Machine], commit_url: str | None) -> str:
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>verify-attn bench: latest results</title>",
           f"<style>{CSS}</style>",
           # asv's page moved to asv.html: an old link or a regressions feed entry (index.html#...) still lands there
           f"<script>if(location.hash.length>1)location.replace('{ASV_PAGE}'+location.hash)</script>",
           "</head><body>",
           f'<nav><a href="{ASV_PAGE}">All benchmarks (asv)</a><a href="{ASV_PAGE}#/regressions">Regressions</a>'
           '<a href="plots/index.html">Plots</a></nav>',
           "<h1>verify-attn bench: the newest commit, per GPU</h1>",
           '<p class="meta">Median time per call; speedup over naive and % of the roofline recorded with the run; '
           "/ FlashMLA: time over FlashMLA's at the same shape (below 1 is faster). The change is judged on the "
           "drift-free series (time over a frozen anchor build's, the two timed in turn in the same process) by "
           f"<code>python -m verify_attn report</code>'s rule: factor {report.FACTOR} and asv's Mann-Whitney test. "
           "Raw only, not judged: one of the two commits lacks the drift-free series there, and raw times of separate "
           "machine starts drift by several %. The trend line (every recorded commit's time) opens the point's "
           "graph.</p>"]
    if not machines:
        out.append("<p>No results yet: run <code>python -m verify_attn run</code>.</p>")
    for m in machines:
        out.append(f"<h2>{esc(m.name)}</h2>")
        if m.commits:
            new_sha, new_date = m.commits[-1]
            when = _date(new_date)
            line = f"newest {commit_link(new_sha, commit_url)} ({esc(when)})"
            if len(m.commits) > 1:
                old_sha = m.commits[-2][0]
                url = compare_url(old_sha, new_sha, commit_url)
                line += f" against {commit_link(old_sha, commit_url)}"
                if url:
                    line += f' (<a href="{esc(url)}">diff</a>)'
            out.append(f'<p class="meta">{line}; {len(m.commits)} commits recorded. {esc(m.ceilings)}.</p>')
        if m.summary:
            cls = "bad" if m.code else "ok" if m.judged else "na"
            out.append(f'<p class="meta">Last commit, whole suite: <span class="{cls}" id="verdict-{esc(m.name)}">'
                       f"{esc(m.summary)}</span></p>")
        glance = _glance(m)
        if glance:
            out.append(f'<div class="glance">{glance}</div>')
        if not m.points:
            out.append("<p>None of the headline points was measured on this machine.</p>")
            continue
        out.append(f'<p class="meta">{_profile_words(m)}</p>')
        out.append('<div class="scroll"><table><thead><tr><th class="l">impl</th><th>ms</th><th>x naive</th>'
                   '<th>% roofline</th><th>/ FlashMLA</th><th class="l">since previous commit</th>'
                   '<th class="hide-sm">trend</th></tr></thead><tbody>')
        shape = None
        for p in m.points:
            if (p.cls, tuple(p.shape.items())) != shape:
                shape = (p.cls, tuple(p.shape.items()))
                out.append(f'<tr class="shape"><td colspan="7">{esc(_shape_words(p.cls, p.shape))}</td></tr>')
            words, css = change_words(p.row)
            if m.commits and len(m.commits) > 1 and p.row is not None and p.row.change not in ("new",):
                url = compare_url(m.commits[-2][0], m.commits[-1][0], commit_url)
                words_html = f'<a href="{esc(url)}">{esc(words)}</a>' if url else esc(words)
            else:
                words_html = esc(words)
            row_id = esc(f"{m.name}-{p.case}-{p.impl}".replace(" ", "-"))
            out.append(f'<tr id="{row_id}" data-impl="{esc(p.impl)}"><td class="l"><a href="{esc(p.graph)}">'
                       f"{esc(p.impl)}</a></td><td>{fmt(p.ms, '.4g')}</td><td>{fmt(p.speedup, '.3g', 'x')}</td>"
                       f"<td>{fmt(None if p.peak is None else 100 * p.peak, '.3g', '%')}</td>"
                       f"<td>{fmt(p.vs_reference, '.2f')}</td><td class=\"v {css}\">{words_html}</td>"
                       f'<td class="hide-sm"><a href="{esc(p.graph)}" title="graph">{sparkline(p.trend)}</a></td></tr>')
            if p.hardware:
                out.append(f'<tr class="hw"><td></td><td class="v hw" colspan="6">hardware (ncu): {esc(p.hardware)}</td></tr>')
        out.append("</tbody></table></div>")
    out.append('<p class="meta">Every series, every point: <a href="asv.html">asv\'s benchmark grid</a>. '
               "How the numbers are taken: the repository's README and docs/timing.md.</p></body></html>")
    return "\n".join(out) + "\n"


def _date(ms) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _shape_words(cls: str, shape: dict) -> str:
    what = {"Chain": "chain tree, batch 1 (FlashMLA's shapes)", "Serving": "serving step, ragged paged trees",
            "ServingChain": "serving step, ragged chain trees (FlashMLA's form)",
            "Quick": "Quick: the pull-request gate's point"}.get(cls, cls)
    return f"{what}: " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in shape.items())


def _profile_words(m: Machine) -> str:
    """Whether the newest commit has the profiler's view, and what it is."""
    if not m.profiled:
        return (f"Hardware view (Nsight Compute at Quick's points, {PROFILE_SUITE}.Profile): not profiled at this "
                "commit.")
    return ("Hardware view under Quick's rows: Nsight Compute's counters for one call at this commit (its clocks "
            f"locked for the replay; {PROFILE_SUITE}.Profile, drawn, not judged), then what moved since the previous "
            f"commit's profile: a % of peak by {MOVED_POINTS:g} points or more, the DRAM bandwidth by "
            f"{100 * MOVED_SHARE:g}% or more, the SM tail by {MOVED_TAIL:g} or more, any count.")


def _glance(m: Machine) -> str:
    """One sentence on tc at the headline shape."""
    cls, shape = HEADLINE[0]
    tc = next((p for p in m.points if p.cls == cls and p.shape == shape and p.impl == "tc" and p.ms), None)
    if tc is None:
        return ""
    ref = next((p for p in m.points if p.cls == cls and p.shape == shape and p.impl == REFERENCE and p.ms), None)
    bits = [f"<b>tc at {esc(_shape_words(cls, shape).split(': ', 1)[1])}: {tc.ms:.4g} ms</b>"]
    if tc.speedup:
        bits.append(f"{tc.speedup:.3g}x faster than naive")
    if ref:
        bits.append(f"FlashMLA {ref.ms:.4g} ms (tc / FlashMLA {tc.vs_reference:.2f})")
    if tc.peak:
        bits.append(f"{100 * tc.peak:.3g}% of the roofline")
    quick = next((p for p in m.points if p.cls == "Quick" and p.shape == shape and p.impl == "tc" and p.speedup), None)
    if quick and not tc.speedup:
        bits.append(f"{quick.speedup:.3g}x faster than naive at Quick's point of that shape (random tree)")
    bits.append(f"since the previous commit: {esc(change_words(tc.row)[0])}")
    return "; ".join(bits) + "."


def build(results_dir: Path, out: Path, commit_url: str | None = None) -> Path:
    """Write the landing page for every machine under results_dir (GPUs first) to out."""
    bench_file = results_dir / "benchmarks.json"
    benchmarks = json.loads(bench_file.read_text()) if bench_file.exists() else {}
    names = sorted((p.parent.name for p in results_dir.glob("*/machine.json")),
                   key=lambda n: (n.startswith("cpu"), n))
    machines = [machine_page(results_dir, n, benchmarks) for n in names if results_files(results_dir, n)]
    out.write_text(render(machines, commit_url))
    return out
