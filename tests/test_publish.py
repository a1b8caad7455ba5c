"""The published site: plots drawn from real asv results (a copy of this repository, two
commits, CPU backend, tiny grid), the "Plots" link on asv's front page, asv's JavaScript and
CSS served from the site itself, and every page rendered in a real headless Chromium that
cannot reach the network, with no failed request and no console or script error."""

import ast
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from conftest import Watched, copy_files, serve
from verify_attn import machine
from verify_attn_tools import assets, plots, publish

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("roofline", "speedup", "peak_fraction", "chain", "history")
CPU_KINDS = tuple(k for k in KINDS if k != "chain")  # the tiny CPU grid has no Chain points


def run(cmd, cwd, env=None):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """asv run over two commits of a copy of the repository, then python -m verify_attn publish."""
    tmp = tmp_path_factory.mktemp("publish")
    repo = tmp / "repo"
    copy_files(repo)  # the work tree as it is
    env = dict(os.environ, HOME=str(tmp / "home"), VERIFY_ATTN_CACHE=str(tmp / "cache"), VERIFY_ATTN_GRID="tiny",
               VERIFY_ATTN_DEVICE="cpu", VERIFY_ATTN_BASE_PYTHON=sys.executable)
    (tmp / "home").mkdir()
    run(["git", "init", "-q", "-b", "main"], repo)
    for n, when in enumerate(("2026-01-01T00:00:00", "2026-01-02T00:00:00")):  # distinct dates: a defined order
        if n:
            with open(repo / "benchmarks" / "NOTES.txt", "a") as f:
                f.write("\nA second commit.\n")
        run(["git", "add", "-A"], repo)
        run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"commit {n}", "--date", when],
            repo, dict(os.environ, GIT_COMMITTER_DATE=when))
    asv = [sys.executable, "-m", "asv"]
    run([*asv, "machine", "--yes", "--machine", "ci"], repo, env)
    run([*asv, "run", "--machine", "ci", "--record-samples", "-b", "Heads8", "ALL"], repo, env)
    run([sys.executable, "-m", "verify_attn", "publish"], repo, env)
    return repo


def test_publish_draws_plots_and_links_them(published):
    html = published / "html"
    for kind in CPU_KINDS:
        png = html / "plots" / f"ci-{kind}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    page = (html / "plots" / "index.html").read_text()
    assert all(f'src="ci-{kind}.png"' in page for kind in CPU_KINDS)
    assert 'href="../index.html"' in page and "same process" in page and "tree-aware cost model" in page

    # asv's graph pages open on each parameter's first value: the newest kernel under test that
    # runs here (the CPU: flash), and the ratio series say which way round they are.
    benchmarks = json.loads((html / "index.json").read_text())["benchmarks"]
    naive = benchmarks["bench_verify_attn.Heads8.track_time_vs_naive"]
    assert naive["params"][-1][0] == "'flash'" and "1/speedup, lower is better" in naive["unit"]
    assert "1/fraction of peak" in benchmarks["bench_verify_attn.Heads8.track_time_vs_roofline"]["unit"]

    index = html / "asv.html"  # asv's front page, moved aside for the landing page (index.html)
    assert index.read_text().count('href="plots/index.html"') == 1 and 'href="index.html"' in index.read_text()
    assert not publish.inject_link(index)  # idempotent: a second pass adds nothing
    assert index.read_text().count('href="plots/index.html"') == 1


# ---------------------------------------------------------------------------------------
# Plots from synthetic GPU results (ceilings, heads 64, a commit lacking benchmarks): fast.

PARAMS = [["9", "33"], ["0", "2048", "16384", "65536"], ["'naive'", "'flash'", "'torch'"]]


def write_results(results_dir: Path, name: str, commit: str, date: int, classes: dict, peaks=None,
                  recorded_cost: float | None = None, chain: bool = False):
    """An asv results file through asv's own API, the kernels reaching a fixed share of the roofline."""
    from asv import results as asv_results, runner

    share = {"naive": 0.02, "flash": 0.4, "torch": 0.1}
    (results_dir / name).mkdir(parents=True, exist_ok=True)
    (results_dir / name / "machine.json").write_text(json.dumps({"machine": name, "version": 1}))
    res = asv_results.Results({"machine": name}, {}, commit, date, "3.11", "reuse-py3.11", {})
    for cls, (heads, keep) in classes.items():
        series = {"track_time": [], "track_time_vs_naive": [], "track_time_vs_roofline": [], "track_flops": [],
                  "track_bytes": []}
        for combo in itertools.product(*PARAMS):
            q, p, impl = (ast.literal_eval(v) for v in combo)
            ok = keep(q, p, impl)
            flops, bytes_ = plots.modelled_cost(heads, q, p) if ok else (0, 0)
            roof = max(flops / 784e12, bytes_ / 4.17e12)
            for key, value in (("track_flops", flops * (recorded_cost or 1)), ("track_bytes", bytes_ * (recorded_cost or 1)),
                               ("track_time", roof / share[impl]),
                               ("track_time_vs_naive", share["naive"] / share[impl]),
                               ("track_time_vs_roofline", 1 / share[impl])):
                series[key].append(value if ok else None)
        if recorded_cost is None:  # results from before FLOPs and bytes were recorded
            del series["track_flops"], series["track_bytes"]
        for key, vals in series.items():
            res.add_result({"name": f"bench_verify_attn.{cls}.{key}", "params": PARAMS, "version": "1"},
                           runner.BenchmarkResult(vals, [None] * len(vals), [None] * len(vals), 0, "", None))
    if chain:  # Chain: heads 64, q_len 9, two prefixes, tc and the FlashMLA reference
        params = [["64"], ["9"], ["2048", "65536"], ["'tc'", "'flashmla'"]]
        times = {"track_time": [1e-4, 1e-3, 5e-5, 6e-4], "track_flops": [2.6e9, 8.2e10, 2.6e9, 8.2e10]}
        for key, vals in times.items():
            res.add_result({"name": f"bench_verify_attn.Chain.{key}", "params": params, "version": "1"},
                           runner.BenchmarkResult(vals, [None] * 4, [None] * 4, 0, "", None))
    for key, value in (peaks or {}).items():
        res.add_result({"name": f"bench_machine.Machine.{key}", "params": [], "version": "1"},
                       runner.BenchmarkResult([value], [None], [None], 0, "", None))
    res.save(str(results_dir))


def test_plots_from_gpu_results(tmp_path, caplog):
    results = tmp_path / "results"
    every = lambda q, p, impl: True  # noqa: E731
    quick = lambda q, p, impl: q == 9 and p >= 2048 and impl != "torch"  # noqa: E731
    peaks = {"track_peak_tflops": 784.0, "track_peak_gbps": 4170.0}
    write_results(results, "nvidia-h200", "a" * 40, 1000, {"Heads8": (8, every), "Heads64": (64, every)}, peaks,
                  chain=True)
    write_results(results, "nvidia-h200", "e" * 40, 1500, {"Heads8": (8, every)}, recorded_cost=2.0)
    write_results(results, "nvidia-h200", "b" * 40, 2000, {"Quick": (64, quick)})  # a pull request: Quick only
    write_results(results, "nvidia-h200", "c" * 40, 3000, {})  # a commit whose build failed: nothing
    # An unknown machine without Machine tracks: no ceilings, still drawn.
    write_results(results, "other-gpu", "d" * 40, 1000, {"Heads8": (8, every)}, chain=True)

    runs = plots.load_runs(results, "nvidia-h200")
    assert [r.commit[0] for r in runs] == ["a", "e", "b", "c"]
    # FLOPs and bytes as recorded with a run, else (older results) by today's cost model.
    assert plots.point_cost(runs[1], "Heads8", 8, (9, 2048, "flash")) == tuple(
        2.0 * v for v in plots.modelled_cost(8, 9, 2048))
    assert plots.point_cost(runs[0], "Heads8", 8, (9, 2048, "flash")) == plots.modelled_cost(8, 9, 2048)
    assert runs[0].grid("Heads64", "track_time_vs_naive")[(9, 65536, "flash")] == pytest.approx(0.05)
    assert plots.ceilings(runs, "nvidia-h200").source.startswith("recorded")
    assert plots.ceilings([], "nvidia-h200").tflops == machine.KNOWN["NVIDIA H200"].flops / 1e12  # by name
    assert plots.ceilings(plots.load_runs(results, "other-gpu"), "other-gpu") is None

    out = tmp_path / "plots"
    written = plots.main(results, out)
    assert sorted(p.name for p in written) == sorted(f"{m}-{k}.png" for m in ("nvidia-h200", "other-gpu")
                                                     for k in KINDS)
    assert "no ceilings" in caplog.text
    page = (out / "index.html").read_text()
    assert page.count("<img ") == 2 * len(KINDS) and "Not drawn" not in page

    # Nothing at all: no crash, a page that says so.
    assert plots.main(tmp_path / "none", tmp_path / "empty") == []
    assert "No plots" in (tmp_path / "empty" / "index.html").read_text()


# ---------------------------------------------------------------------------------------
# The site works offline: asv's JavaScript and CSS come from the site itself (html/vendor/,
# from verify_attn_tools/site_assets/, taken from the npm registry by publish --fetch-assets).

def test_vendored_assets_cover_asv(published):
    """Every URL of another site that asv's pages load has a vendored copy, the one that the
    shared mapping (assets.npm_source) names, with the recorded bytes; the published pages
    load none of them from the network, and the CDN's own bytes keep their integrity check."""
    files = assets.manifest()
    wanted = {url for page in assets.asv_pages() for url in assets.remote_urls(page.read_text())}
    assert wanted and wanted <= set(files), sorted(wanted - set(files))
    for url, entry in files.items():
        spec, path, _ = assets.npm_source(url)
        assert (entry["package"], entry["path"]) == (spec, path), url
        assert entry["file"] == f"{spec}/{path}"
        body = (assets.HERE / entry["file"]).read_bytes()
        assert assets.sha256(body) == entry["sha256"] and len(body) == entry["bytes"], entry["file"]
    on_disk = {p.relative_to(assets.HERE).as_posix() for p in assets.HERE.rglob("*") if p.is_file()}
    assert on_disk == {e["file"] for e in files.values()} | {assets.MANIFEST}  # nothing the pages do not load

    html = published / "html"
    pages = sorted(html.rglob("*.html"))
    assert {"index.html", "asv.html", "error.html", "plots/index.html"} <= {p.relative_to(html).as_posix() for p in pages}
    for page in pages:
        assert assets.remote_urls(page.read_text()) == [], page
    index = (html / "asv.html").read_text()
    for url, entry in files.items():
        assert (html / "vendor" / entry["file"]).read_bytes() == (assets.HERE / entry["file"]).read_bytes()
        tag = next(t[0] for t in assets.TAG.finditer(index) if f'"vendor/{entry["file"]}"' in t[0])
        assert ("integrity=" in tag) == entry["same_as_cdn"], tag
    assert sum(e["same_as_cdn"] for e in files.values()) >= 5  # jquery, bootstrap (2), orderbars, md5


def fake_asv_publish(page: str):
    """Stands in for `asv publish` (subprocess.call): writes an html/ with this front page."""
    def call(cmd, cwd):
        # Where publish points asv: a staging directory it swaps into html/ on success.
        html = Path(json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())["html_dir"])
        html.mkdir(parents=True, exist_ok=True)
        (html / "index.html").write_text(page)
        (html / "index.json").write_text(json.dumps({"benchmarks": {}, "graph_param_list": []}))
        return 0
    return call


def test_publish_vendors_and_refuses_unknown_urls(tmp_path, monkeypatch, capsys):
    jquery = "https://code.jquery.com/jquery-3.3.1.min.js"
    flot = "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js"
    entry = assets.manifest()
    page = (f'<html><head><script src="{jquery}" integrity="sha256-FgpCb/KJQlLNfOu91ta32o/NMZxltwRo8QtmkMRdAu8=" '
            f'crossorigin="anonymous"></script>\n<script src=\'{flot}\' integrity="sha512-AAAA"></script>'
            '<link rel="stylesheet" href="asv.css"><link rel="alternate" href="https://example.org/feed.xml">'
            '</head><body><ul id="nav"></ul>'
            '<a href="https://github.com/airspeed-velocity/asv/">asv</a></body></html>')
    monkeypatch.setattr(publish.subprocess, "call", fake_asv_publish(page))
    shutil.copy(ROOT / "asv.conf.json", tmp_path)
    write_results(tmp_path / "results", "gpu", "a" * 40, 1000, {})
    assert publish.publish(tmp_path) == 0
    html = tmp_path / "html"
    text = (html / "asv.html").read_text()
    assert assets.remote_urls(text) == []  # links to other sites stay: they load nothing
    assert "https://github.com/airspeed-velocity/asv/" in text and "https://example.org/feed.xml" in text
    assert f'src="vendor/{entry[jquery]["file"]}" integrity="sha256-' in text  # the CDN's bytes: still checked
    assert f"src='vendor/{entry[flot]['file']}'>" in text  # a build of npm's own: no integrity to fail
    assert 'href="plots/index.html"' in text and 'href="asv.css"' in text
    assert (html / "vendor" / entry[jquery]["file"]).read_bytes() == (assets.HERE / entry[jquery]["file"]).read_bytes()
    # A page deeper down points one level up; a second pass changes nothing.
    (html / "plots" / "index.html").write_text(f'<script src="{jquery}"></script>')
    assert assets.vendor(html) == [html / "plots" / "index.html"]
    assert (html / "plots" / "index.html").read_text() == f'<script src="../vendor/{entry[jquery]["file"]}"></script>'

    # A URL site_assets/ does not know (a new asv release): publish fails, in one line naming it.
    unknown = "https://cdn.jsdelivr.net/npm/somelib@9.9.9/dist/somelib.min.js"
    monkeypatch.setattr(publish.subprocess, "call", fake_asv_publish(page.replace("</head>", f'<script src="{unknown}"></script></head>')))
    capsys.readouterr()
    assert publish.publish(tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and unknown in err and err.startswith("python -m verify_attn publish: asv.html loads")
    with pytest.raises(assets.UnknownAsset, match="//cdn.example.org/x.css"):
        assets.vendor(_page(tmp_path / "other", '<link href="//cdn.example.org/x.css">'))


def test_publish_before_any_run_says_run_first(tmp_path, monkeypatch, capsys):
    """publish --local on a fresh clone: one line naming `python -m verify_attn run`, not asv's
    own advice (asv run --bench just-discover), exit 3, nothing written, asv not even started."""
    monkeypatch.setattr(publish.subprocess, "call", lambda *a, **k: pytest.fail("asv publish started"))
    shutil.copy(ROOT / "asv.conf.json", tmp_path)
    for local in (True, False):
        assert publish.publish(tmp_path, local=local) == publish.NO_RESULTS_EXIT
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "python -m verify_attn run" in err and "just-discover" not in err, err
    assert not (tmp_path / "html").exists() and not (tmp_path / ".asv" / "local" / "html").exists()


def _page(html: Path, text: str) -> Path:
    html.mkdir(parents=True, exist_ok=True)
    (html / "index.html").write_text(text)
    return html


# ---------------------------------------------------------------------------------------
# The browser test: every page of the published site in headless Chromium (Playwright on the
# system's Chromium, conftest.chromium), from a local server, with every request to another
# site refused and no host name but 127.0.0.1 resolving: no failed request, no console
# error, no script error.

@pytest.fixture
def site(published, chromium):
    """The published html/ as it is, on a local server (random free port), in an offline page."""
    html = published / "html"
    server, origin = serve(html)
    watched = Watched(chromium, origin)
    try:
        yield watched, origin, html
    finally:
        watched.close()
        server.shutdown()
        server.server_close()


def assert_screenshot(path: Path):
    image = matplotlib.image.imread(path)
    assert path.stat().st_size > 10_000 and image.shape[0] >= 600 and image.shape[1] >= 1000
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 50, f"{path} is nearly blank"


def screenshot(page, path: Path) -> Path:
    page.screenshot(path=str(path))
    return path


def test_site_renders_offline_in_chromium(site, tmp_path):
    w, origin, html = site
    page = w.open("asv.html")

    # asv's front page: the summary grid filled in, the Plots link shown, a tile's graph drawn
    # (asv draws a tile once it is scrolled into view) with both commits in it.
    names = page.wait_for_function("""() => {
        const boxes = [...document.querySelectorAll('#summarygrid-display .benchmark-container')];
        const link = document.querySelector('#nav a[href="plots/index.html"]');
        return boxes.length && link && link.offsetParent !== null ? boxes.map(b => b.textContent) : null;
    }""").json_value()
    assert "Heads8.track_time" in names and len(names) > 20, names
    assert page.evaluate("[...document.scripts].filter(s => s.src && !s.src.startsWith(location.origin)).length") == 0
    points = page.wait_for_function("""() => {
        const tile = document.getElementById('summarygrid-bench_verify_attn.Heads8.track_time');
        tile.scrollIntoView();
        window.dispatchEvent(new Event('scroll'));
        const plot = jQuery(tile).data('plot');
        return plot && tile.querySelector('canvas.flot-base') ? plot.getData()[0].data.length : 0;
    }""").json_value()
    assert points == 2
    assert_screenshot(screenshot(page, tmp_path / "asv.png"))

    # Every graph page the grid links to (one per benchmark): flot draws it, every file loads.
    links = page.eval_on_selector_all("#summarygrid-display a.benchmark-container",
                                      "as => as.map(a => a.getAttribute('href'))")
    benchmarks = json.loads((html / "index.json").read_text())["benchmarks"]
    assert sorted(links) == sorted(f"#{name}" for name in benchmarks)
    drawn = {}
    for link in links:
        page.evaluate("link => { jQuery('#main-graph').removeData('plot'); location.hash = link; }", link)
        drawn[link] = page.wait_for_function("""() => {
            const plot = jQuery.active === 0 && jQuery('#graph-display').is(':visible') && jQuery('#main-graph').data('plot');
            return plot ? {series: plot.getData().filter(s => s.data && s.data.length).length} : null;
        }""").json_value()
    assert drawn["#bench_verify_attn.Heads8.track_time_vs_naive"]["series"] >= 1, drawn
    page.evaluate("location.hash = '#bench_verify_attn.Heads8.track_time_vs_naive'")
    page.wait_for_function("jQuery.active === 0 && jQuery('#main-graph canvas.flot-base').length > 0")
    assert_screenshot(screenshot(page, tmp_path / "graph.png"))

    # The benchmark list (sorted by stupidtable) and the regressions page.
    page.evaluate("location.hash = '#/summarylist'")
    rows = page.wait_for_function("""jQuery.active === 0 && jQuery('#summarylist-display').is(':visible')
        && jQuery('#summarylist-display table tbody tr').length""").json_value()
    assert rows >= 14
    page.locator("#summarylist-display table thead th").first.click()
    page.wait_for_function("jQuery('#summarylist-display table thead th.sorting-asc, "
                           "#summarylist-display table thead th.sorting-desc').length > 0")
    page.evaluate("location.hash = '#/regressions'")
    page.wait_for_function("jQuery.active === 0 && jQuery('#regressions-display').is(':visible') "
                           "&& jQuery('#regressions-body').children().length > 0")
    assert_screenshot(screenshot(page, tmp_path / "regressions.png"))

    # The link leads to the plots page, whose every image loads.
    page = w.open("asv.html")
    page.locator("#nav-li-plots a").click()
    page.wait_for_function("location.pathname === '/plots/index.html' && document.readyState === 'complete'")
    images = page.wait_for_function("""() => {
        const imgs = [...document.images];
        return imgs.length && imgs.every(i => i.complete)
            ? imgs.map(i => ({src: i.getAttribute('src'), alt: i.alt, width: i.naturalWidth})) : null;
    }""").json_value()
    assert sorted(i["src"] for i in images) == sorted(p.name for p in (html / "plots").glob("*.png"))
    assert all(i["width"] > 0 and i["alt"] for i in images), images
    assert page.locator('a[href="../index.html"]').count() >= 1
    assert_screenshot(screenshot(page, tmp_path / "plots.png"))

    # asv's own error page (shown when a script fails to load) loads too, though nothing links to it now.
    page = w.open("error.html")
    page.wait_for_function("document.readyState === 'complete' && document.images[0].complete")

    page.wait_for_timeout(500)  # late errors (a failed image, a script error after load) still count
    assert w.errors == []

    # The watch itself works: a console error, an uncaught exception, a request to another
    # site (refused) and a missing file on the server are all caught.
    page.evaluate("setTimeout(() => { console.error('canary'); throw new Error('canary'); })")
    page.wait_for_timeout(500)
    assert len(w.errors) == 2 and all("canary" in e for e in w.errors), w.errors
    w.errors.clear()
    page.evaluate("fetch('https://cdn.jsdelivr.net/npm/jquery@3.3.1/dist/jquery.min.js').catch(() => 0);"
                  "fetch('/no-such-file.js').catch(() => 0)")
    page.wait_for_timeout(1000)
    assert any(e.startswith("request to another site: https://cdn.jsdelivr.net/") for e in w.errors), w.errors
    assert any(e.startswith("HTTP 404:") and "no-such-file.js" in e for e in w.errors), w.errors
