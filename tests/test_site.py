"""The published site in a real browser (Chromium through Playwright, on the system's Chromium,
nothing downloaded), offline: every request that is not to the local server is aborted and
counted. The landing page answers "how fast is tc at 64K against FlashMLA and naive, and did the
last commit regress?" from the real H200 results; its links lead to graphs and commits that
exist; a graph page opens on plotted data; the regressions page loads; a crafted tag,
parameter value or benchmark description in the results runs no script on any page."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import Watched, serve
from verify_attn_tools import landing, publish

ROOT = Path(__file__).resolve().parent.parent
COMMIT_URL = "https://github.com/example/verify-attn/commit/"
PAYLOAD = "<img src=x onerror=\"window.__pwned=(window.__pwned||0)+1\">"


@pytest.fixture(scope="module")
def h200_site(tmp_path_factory):
    """publish of this checkout's real results (results/nvidia-h200) into a temporary html/."""
    if not any((ROOT / "results").glob("*/*-*.json")):
        pytest.skip("no results/ in this checkout")
    html = tmp_path_factory.mktemp("h200") / "html"
    old = os.environ.get("VERIFY_ATTN_COMMIT_URL")
    os.environ["VERIFY_ATTN_COMMIT_URL"] = COMMIT_URL
    try:
        assert publish.publish(ROOT, html_dir=html) == 0
    finally:
        if old is None:
            del os.environ["VERIFY_ATTN_COMMIT_URL"]
        else:
            os.environ["VERIFY_ATTN_COMMIT_URL"] = old
    server, origin = serve(html)
    yield html, origin
    server.shutdown()
    server.server_close()


def newest(machine: str) -> str:
    return landing.results_files(ROOT / "results", machine)[-1][0]


def test_landing_answers_tc_at_64k(chromium, h200_site, tmp_path):
    html, origin = h200_site
    w = Watched(chromium, origin)
    page = w.open("")
    assert page.title().startswith("verify-attn bench")
    sha = newest("nvidia-h200")
    # tc and FlashMLA at heads 64, q_len 9, prefix 65,536 of the newest commit, with numbers.
    rows = {}
    for impl in ("tc", "flashmla", "naive"):
        row = page.locator(f'[id="nvidia-h200-Chain-h64-q9-p65536-{impl}"]')
        if impl == "naive" and row.count() == 0:  # naive is not timed at Chain's shapes: Quick's row
            row = page.locator('[id="nvidia-h200-Quick-h64-q9-p65536-naive"]')
        rows[impl] = row.locator("td").all_inner_texts()
        assert re.fullmatch(r"\d+(\.\d+)?(e-?\d+)?", rows[impl][1]), (impl, rows[impl])
    assert float(rows["tc"][1]) > 0 and float(rows["flashmla"][4]) == 1.0
    assert float(rows["tc"][4]) == pytest.approx(float(rows["tc"][1]) / float(rows["flashmla"][1]), rel=0.01)
    verdict = page.locator('[id="verdict-nvidia-h200"]').inner_text()
    assert verdict and ("judged" in verdict or "slower" in verdict or "faster" in verdict), verdict
    glance = page.locator(".glance").first.inner_text()
    assert "tc at heads 64, q_len 9, prefix_len 65,536" in glance and "FlashMLA" in glance and "naive" in glance
    assert page.locator(f'a[href="{COMMIT_URL}{sha}"]').count() >= 1

    # Every link resolves: pages of the site exist, commits are commits of this repository.
    hrefs = page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
    commits = {h[len(COMMIT_URL):] for h in hrefs if h.startswith(COMMIT_URL)}
    compare = COMMIT_URL.replace("/commit/", "/compare/")
    compares = {x for h in hrefs if h.startswith(compare) for x in h[len(compare):].split("...")}
    assert compares and all(re.fullmatch(r"[0-9a-f]{40}", c) for c in commits | compares), (commits, compares)
    for c in commits | compares:
        assert subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT).returncode == 0, c
    local = {h.split("#")[0] for h in hrefs if not h.startswith(("http:", "https:"))}
    assert {"asv.html", "plots/index.html"} <= local
    for target in local:
        assert (html / unquote(target)).is_file(), target
    graphs = [h for h in hrefs if h.startswith("asv.html#bench_verify_attn.")]
    assert len(graphs) >= 20 and all(re.fullmatch(r"[\w.%\-&=?#]+", h) for h in graphs)

    # A graph link opens on its point, drawn.
    tc_graph = page.locator('[id="nvidia-h200-Chain-h64-q9-p65536-tc"] a').first.get_attribute("href")
    page.goto(origin + tc_graph)
    series = page.wait_for_function("""() => {
        const plot = window.jQuery && jQuery.active === 0 && jQuery('#main-graph').data('plot');
        const s = plot ? plot.getData().filter(s => s.data && s.data.some(p => p[1] !== null)) : [];
        return s.length ? s.map(s => s.label || '') : null;
    }""", timeout=30000).json_value()
    assert len(series) == 1, series
    page.screenshot(path=str(tmp_path / "graph.png"))

    # Readable at a phone's width: the page itself does not scroll sideways (the table does).
    m = Watched(chromium, origin, width=390)
    mpage = m.open("")
    assert mpage.evaluate("document.documentElement.scrollWidth") <= 400
    assert mpage.locator('[id="nvidia-h200-Chain-h64-q9-p65536-tc"]').is_visible()
    mpage.screenshot(path=str(tmp_path / "landing-mobile.png"), full_page=True)
    page.goto(origin)
    page.screenshot(path=str(tmp_path / "landing.png"), full_page=True)
    page.wait_for_timeout(300)
    assert w.errors == [] and m.errors == []
    w.close()
    m.close()


def test_graph_pages_open_on_data(chromium, h200_site):
    """A grid tile's link names no parameters: Quick's graph opens at prefix 65,536 (Quick times
    no prefix 0, asv's first value) on a log axis, every curve with points."""
    html, origin = h200_site
    w = Watched(chromium, origin)
    page = w.open("asv.html")
    page.wait_for_function("document.querySelectorAll('#summarygrid-display .benchmark-container').length > 20")
    page.click('a[href="#bench_verify_attn.Quick.track_time"]')
    page.wait_for_function("location.hash.indexOf('?') > 0")
    hash_ = unquote(page.evaluate("location.hash"))
    assert "p-prefix_len=65536" in hash_ and "y-axis-scale=log" in hash_ and "p-impl='tc'" in hash_, hash_
    drawn = page.wait_for_function("""() => {
        const plot = jQuery.active === 0 && jQuery('#main-graph').data('plot');
        if (!plot) return null;
        const s = plot.getData().filter(s => s.data && s.data.length);
        return s.length ? s.map(s => s.data.filter(p => p[1] !== null).length) : null;
    }""", timeout=30000).json_value()
    assert drawn and all(n > 0 for n in drawn), drawn
    assert page.locator("#log-scale.active").count() == 1
    # Commit labels on the time axis: where the drift-free series start against the anchor.
    anchor = next(t for t in json.loads((html / "index.json").read_text())["tags"] if t.startswith("anchor "))
    assert page.locator("#main-graph div", has_text=anchor).count() >= 1
    # The machine's details in its tooltip.
    page.hover("#machine-nvidia-h200, .btn:text-is('nvidia-h200')")
    assert "driver" in page.locator(".tooltip-inner").first.inner_text(timeout=10000)
    # The regressions page and the way back to the landing page.
    page.goto(origin + "asv.html#/regressions")
    page.wait_for_function("jQuery.active === 0 && jQuery('#regressions-display').is(':visible') "
                           "&& jQuery('#regressions-body').children().length > 0")
    assert page.locator('#nav a[href="index.html"]').count() == 1
    # An old link to asv's page (index.html#...) still lands there.
    page.goto(origin + "index.html#/regressions")
    page.wait_for_function("location.pathname === '/asv.html' && jQuery('#regressions-display').is(':visible')")
    page.wait_for_timeout(300)
    assert w.errors == []
    w.close()


def test_graph_pages_carry_machine_details_and_commit_labels(h200_site):
    """index.json, which asv's graph pages read: the machine's tooltip holds its recorded driver,
    CUDA, SMs and clocks; labelled lines mark the anchor's first commit and the accepted steps."""
    html, _ = h200_site
    index = json.loads((html / "index.json").read_text())
    info = index["machines"]["nvidia-h200"]
    assert {"driver", "CUDA", "SMs", "SM clock", "ceilings"} <= set(info), info
    assert re.fullmatch(r"\d+", info["SMs"]) and "TFLOP/s" in info["ceilings"], info
    assert info["details recorded at"] == f"commit {newest('nvidia-h200')[:8]}"
    hash_of = index["revision_to_hash"]
    tags = {t: hash_of[str(r)] for t, r in index["tags"].items()}
    anchors = [t for t in tags if t.startswith("anchor ")]

    def anchor_versions(sha: str) -> set:
        data = json.loads(next((ROOT / "results" / "nvidia-h200").glob(f"{sha[:8]}-*.json")).read_text())
        column = data["result_columns"].index("version")
        return {row[column] for k, row in data["results"].items() if k.endswith(".track_time_vs_anchor")}

    first = {}  # each anchor's first commit
    for sha, _ in landing.results_files(ROOT / "results", "nvidia-h200"):
        for version in anchor_versions(sha):
            first.setdefault(version.replace("-", " ", 1), sha)
    assert first and {t: tags[t] for t in anchors} == first, (anchors, first)
    accepted = {t for t in tags if t.startswith("accepted ")}
    from verify_attn_tools import regressions

    assert accepted == {f"accepted {e['commit']}" for e in regressions.load_accepted(ROOT) if e["commit"]}
    assert {"accepted 0e15fd2", "accepted 528910d"} <= accepted
    assert all(tags[t].startswith(t.split()[1]) for t in accepted)


def test_the_watch_catches_errors(chromium, h200_site):
    """The checks above can fail: a console error, an exception, a request to another site and
    a missing file are all caught."""
    _, origin = h200_site
    w = Watched(chromium, origin)
    page = w.open("")
    page.evaluate("setTimeout(() => { console.error('canary'); throw new Error('canary'); })")
    page.evaluate("fetch('https://cdn.jsdelivr.net/npm/jquery@3.3.1/dist/jquery.min.js').catch(() => 0);"
                  "fetch('/no-such-file.js').catch(() => 0)")
    page.wait_for_timeout(800)
    assert any("console: canary" in e for e in w.errors) and any("exception" in e for e in w.errors), w.errors
    assert any(e.startswith("request to another site: https://cdn.jsdelivr.net/") for e in w.errors), w.errors
    assert any(e.startswith("HTTP 404") and "no-such-file.js" in e for e in w.errors), w.errors
    w.close()


# ---------------------------------------------------------------------------------------
# Crafted names (issue 18): a git tag, a parameter value, a benchmark's description and unit
# holding markup run no script on any page of the published site.

def git(repo, *args, env=None):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture(scope="module")
def crafted_site(tmp_path_factory):
    from asv import results as asv_results, runner, util

    repo = tmp_path_factory.mktemp("crafted") / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "asv.conf.json", repo)
    shutil.copytree(ROOT / "asv_plugins", repo / "asv_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "benchmarks").mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for n in range(3):
        (repo / "n.txt").write_text(str(n))
        when = f"2026-01-0{n + 1}T00:00:00"
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"commit {n}", "--date", when, env=dict(os.environ, GIT_COMMITTER_DATE=when))
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "tag", PAYLOAD.replace(" ", "/").replace('"', ""), shas[1])  # a tag name: no spaces or quotes
    crafted = repr(PAYLOAD)  # a parameter value: a Python literal holding markup
    params = [["64"], ["9"], ["65536"], ["'tc'", "'flashmla'", crafted]]
    names = ["heads", "q_len", "prefix_len", "impl"]
    series = {f"bench_verify_attn.Chain.{m}": (params, names) for m in
              ("track_time", "track_time_vs_anchor", "track_time_vs_naive", "track_time_vs_roofline")}
    results = repo / "results"
    (results / "gpu").mkdir(parents=True)
    (results / "gpu" / "machine.json").write_text(json.dumps({"machine": "gpu", "version": 1}))
    util.write_json(str(results / "benchmarks.json"), {
        name: {"name": name, "params": p, "param_names": pn, "type": "track", "unit": f"s {PAYLOAD}",
               "pretty_name": f"time {PAYLOAD}", "version": "1", "code": PAYLOAD, "timeout": 60}
        for name, (p, pn) in series.items()}, api_version=2)
    for n, sha in enumerate(shas):
        res = asv_results.Results({"machine": "gpu"}, {}, sha, 1767225600000 + n * 86400000, "3.11",
                                  "reuse-py3.11", {})
        for name, (p, _) in series.items():
            vals = [1e-4 * (1 if n < 2 else 2), 8e-5, 3e-4] if "vs" not in name else [1.0 * (1 if n < 2 else 2), 1, 1.0 * (1 if n < 2 else 2)]
            samples = [[v * (1 + k / 1000) for k in range(15)] for v in vals]
            res.add_result({"name": name, "params": p, "version": "1"},
                           runner.BenchmarkResult(vals, samples, [None] * 3, 0, "", None), record_samples=True)
        res.save(str(results))
    assert publish.publish(repo) == 0
    html = repo / "html"
    assert PAYLOAD not in (html / "index.html").read_text()
    server, origin = serve(html)
    yield html, origin
    server.shutdown()
    server.server_close()


def test_crafted_names_run_no_script(chromium, crafted_site):
    html, origin = crafted_site
    regressions = json.loads((html / "regressions.json").read_text())["regressions"]
    assert any("onerror" in r[0] for r in regressions), "the crafted value must reach the regressions page"
    w = Watched(chromium, origin)
    page = w.open("")
    visits = [("", "document.readyState === 'complete'"),
              ("asv.html", "document.querySelectorAll('#summarygrid-display .benchmark-container').length > 0"),
              ("asv.html#/summarylist", "jQuery.active === 0 && jQuery('#summarylist-display tbody tr').length > 0"),
              ("asv.html#/regressions", "jQuery.active === 0 && jQuery('#regressions-body tr').length > 0"),
              ("asv.html#bench_verify_attn.Chain.track_time_vs_anchor",
               "jQuery.active === 0 && jQuery('#main-graph canvas.flot-base').length > 0")]
    for path, ready in visits:
        page.goto(origin + path)
        page.wait_for_function(ready, timeout=30000)
        page.wait_for_timeout(300)
        assert [e for e in w.errors if "/x" not in e] == [], (path, w.errors)
        assert page.evaluate("window.__pwned") is None, path
    page.goto(origin + "asv.html#bench_verify_attn.Chain.track_time_vs_anchor?p-impl=" +
              repr(PAYLOAD).replace("<", "%3C").replace(">", "%3E").replace('"', "%22").replace(" ", "%20"))
    page.wait_for_function("jQuery.active === 0 && jQuery('#main-graph canvas.flot-base').length > 0")
    assert page.evaluate("window.__pwned") is None
    assert page.get_by_text(PAYLOAD.split(" ")[0], exact=False).count() >= 1  # shown as text
    assert [e for e in w.errors if "/x" not in e] == [], w.errors  # the <img src=x> shown as text loads nothing

    # The check can fail: the same payload put into a page as HTML does run.
    page.evaluate(f"document.body.insertAdjacentHTML('beforeend', {json.dumps(PAYLOAD)})")
    page.wait_for_function("window.__pwned >= 1", timeout=5000)
    w.close()


def test_the_regressions_feed_carries_no_markup_from_data(crafted_site):
    """asv's Atom feed (regressions.xml): the crafted parameter value reaches an entry's title,
    which Atom carries as text, and its HTML content only URL-encoded in the graph link; the
    crafted unit is not put in (asv writes the values without it for a unit other than seconds
    and bytes). A feed reader rendering the content runs nothing of the data."""
    import xml.etree.ElementTree as ET

    html, _ = crafted_site
    atom = "{http://www.w3.org/2005/Atom}"
    entries = ET.parse(html / "regressions.xml").getroot().findall(f"{atom}entry")
    titles = [e.find(f"{atom}title") for e in entries]
    assert any(PAYLOAD in (t.text or "") and t.get("type", "text") == "text" for t in titles), \
        "the crafted value must reach the feed"
    for entry in entries:
        for field in entry:
            if field.get("type") == "html":
                assert "<img" not in (field.text or "") and "onerror=" not in (field.text or ""), field.text


def test_the_machine_line_counts_the_timers_clocks_not_the_profilers():
    """The landing's "SM clock while timing" reads bench_verify_attn's track_sm_clock; the
    profiler's series is ncu's locked replay clock (1.36-1.50 GHz on the H200) and stays out."""
    from verify_attn_tools import landing

    res = {"bench_verify_attn.Quick.track_sm_clock": ("1", {(64, 9, 2048, "tc"): (1980.0, None, None),
                                                            (8, 9, 65536, "tc"): (1965.0, None, None)}),
           "bench_profile.Profile.track_sm_clock": ("1", {(64, 9, 2048, "tc"): (1361.0, None, None)})}
    line = landing.machine_details(res)["SM clock while timing"]
    assert line == "median 1980 MHz over 2 points (1965-1980, track_sm_clock)", line
