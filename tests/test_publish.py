"""The published site: plots drawn from real asv results (a copy of this repository, two
commits, CPU backend, tiny grid), the "Plots" link on asv's front page, and both pages
rendered in a real headless Chromium with no console errors."""

import ast
import base64
import fcntl
import functools
import hashlib
import http.server
import itertools
import json
import mimetypes
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import matplotlib.image
import numpy as np
import pytest

from verify_attn import machine
from verify_attn_tools import plots, publish

ROOT = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI") == "true"
KINDS = ("roofline", "speedup", "peak_fraction", "chain", "history")
CPU_KINDS = tuple(k for k in KINDS if k != "chain")  # the tiny CPU grid has no Chain points


def need(tool: str) -> str:
    """The tool's path; skipped where it is absent, except on CI, where it must be there."""
    path = shutil.which(tool)
    if path is None:
        if CI:
            pytest.fail(f"{tool} is not installed (CI installs it in .ci/run)")
        pytest.skip(f"{tool} is not installed")
    return path


def run(cmd, cwd, env=None):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """asv run over two commits of a copy of the repository, then python -m verify_attn publish."""
    tmp = tmp_path_factory.mktemp("publish")
    repo = tmp / "repo"
    # Tracked and not-yet-committed files alike: the test runs on the work tree as it is.
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        if not f.startswith(("results/", "html/")) and (ROOT / f).is_file():
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, repo / f)
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

    index = html / "index.html"
    assert index.read_text().count('href="plots/index.html"') == 1
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
# The browser test. asv's page loads jQuery, flot and bootstrap from CDNs that this
# machine cannot reach: the browser is handed the same releases from the npm registry
# instead (through CDP request interception, the page's URLs unchanged).

# cdnjs serves minified builds of its own of these, which no registry ships byte for byte:
# the same release, unminified, from npm (stupidtable 1.0.1 never reached npm: 1.1.3).
CDNJS = {"flot": lambda ver, f: (f"flot@{ver}", f.replace(".min.js", ".js")),
         "stupidtable": lambda ver, f: ("stupid-table-plugin@1.1.3", f),
         "blueimp-md5": lambda ver, f: (f"blueimp-md5@{ver}", f)}


def npm_source(url: str):
    """(npm package spec, path inside the package) that a CDN URL serves, or None."""
    u = urlsplit(url)
    if u.netloc == "code.jquery.com" and (m := re.fullmatch(r"/jquery-([\d.]+)\.min\.js", u.path)):
        return f"jquery@{m[1]}", "dist/jquery.min.js"
    if u.netloc == "cdn.jsdelivr.net" and (m := re.fullmatch(r"/npm/((?:@[^/]+/)?[^@/]+@[^/]+)/(.+)", u.path)):
        return m[1], m[2]
    if u.netloc == "cdnjs.cloudflare.com" and (m := re.fullmatch(r"/ajax/libs/([^/]+)/([^/]+)/(.+)", u.path)):
        return CDNJS[m[1]](m[2], m[3]) if m[1] in CDNJS else None
    return None


class Npm:
    """Files of npm packages, fetched once with `npm pack` into a cache that outlives the run."""

    def __init__(self, npm: str, cache: Path):
        self.npm, self.cache = npm, cache

    @functools.lru_cache(maxsize=None)
    def package(self, spec: str) -> Path:
        dest = self.cache / spec.replace("/", "+")
        if not dest.exists():
            tmp = self.cache / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run([self.npm, "pack", "--silent", "--pack-destination", str(tmp), spec],
                                  capture_output=True, text=True, timeout=180)
            assert proc.returncode == 0, f"npm pack {spec}: {proc.stderr}"
            part = dest.parent / (dest.name + ".part")  # renamed when whole: no half-extracted package
            with tarfile.open(tmp / proc.stdout.split()[-1]) as tar:
                tar.extractall(part, filter="data")
            part.rename(dest)
        (top,) = dest.iterdir()  # npm tarballs hold one folder, usually package/
        return top

    def resolve(self, url: str) -> bytes | None:
        src = npm_source(url)
        path = self.package(src[0]) / src[1] if src else None
        return path.read_bytes() if path and path.is_file() else None


def sri_ok(body: bytes, integrity: str) -> bool:
    return any(base64.b64encode(hashlib.new(algo, body).digest()).decode() == digest
               for algo, digest in (token.split("-", 1) for token in integrity.split()))


def relax_integrity(page: str, resolve) -> tuple[str, list[str]]:
    """Drop the integrity attribute of the tags whose stand-in is not the CDN's very file
    (it would be refused); the byte-identical ones keep theirs and are checked."""
    relaxed = []

    def fix(m):
        tag = m[0]
        url, integrity = re.search(r'(?:src|href)="([^"]+)"', tag), re.search(r'\sintegrity="([^"]+)"', tag)
        if url and integrity and not sri_ok(resolve(url[1]) or b"", integrity[1]):
            relaxed.append(url[1])
            return tag.replace(integrity[0], "")
        return tag

    return re.sub(r"<(?:script|link)\b[^>]*>", fix, page), relaxed


class Browser:
    """Headless Chromium over the DevTools protocol on --remote-debugging-pipe (NUL-terminated
    JSON on fds 3 and 4): no websocket client, nothing to install but Chromium. Collects
    console errors, uncaught exceptions and failed loads; serves CDN requests from `resolve`."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900", "--enable-logging=stderr",
             "--v=0"]

    def __init__(self, exe: str, profile: Path, log: Path, origin: str, resolve):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        # bash moves Chromium's ends onto fds 3 and 4, where it looks for them; first out of the
        # way (10 and up), so that neither is one of 3 and 4 already.
        child = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_r, from_w)]
        os.close(to_r)
        os.close(from_w)
        to_r, from_w = child
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-', exe, *self.FLAGS,
             f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self.out = os.fdopen(to_w, "wb", buffering=0)
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(from_r,), daemon=True).start()
        self.origin, self.resolve, self.ids = origin, resolve, itertools.count(1)
        self.errors: list[str] = []
        target = self.call("Target.createTarget", url="about:blank", timeout=60)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(method, session=self.session)
        self.call("Fetch.enable", session=self.session, patterns=[{"urlPattern": "*"}])

    def _read(self, fd):
        buf = bytearray()
        while chunk := os.read(fd, 1 << 16):
            buf += chunk
            while (end := buf.find(b"\0")) >= 0:
                self.inbox.put(json.loads(buf[:end]))
                del buf[: end + 1]
        os.close(fd)
        self.inbox.put(None)

    def send(self, method, session=None, **params) -> int:
        msg = {"id": next(self.ids), "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.out.write(json.dumps(msg).encode() + b"\0")
        return msg["id"]

    def _next(self, deadline):
        try:
            msg = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return "timeout"
        if msg is None:
            raise RuntimeError(f"Chromium exited; see {self.log.name}")
        if "method" in msg:
            self._event(msg["method"], msg.get("params", {}))
        return msg

    def call(self, method, session=None, timeout=30, **params) -> dict:
        want, deadline = self.send(method, session, **params), time.monotonic() + timeout
        while (msg := self._next(deadline)) != "timeout":
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
        raise TimeoutError(method)

    def pump(self, seconds):
        deadline = time.monotonic() + seconds
        while self._next(deadline) != "timeout":
            pass

    def _event(self, method, p):
        if method == "Fetch.requestPaused":
            url, rid = p["request"]["url"], p["requestId"]
            if url.startswith(self.origin):
                self.send("Fetch.continueRequest", self.session, requestId=rid)
            elif (body := self.resolve(url)) is not None:
                kind = mimetypes.guess_type(urlsplit(url).path)[0] or "application/octet-stream"
                self.send("Fetch.fulfillRequest", self.session, requestId=rid, responseCode=200,
                          body=base64.b64encode(body).decode(),
                          responseHeaders=[{"name": "Content-Type", "value": kind},
                                           {"name": "Access-Control-Allow-Origin", "value": "*"}])
            else:
                self.errors.append(f"request with no local stand-in: {url}")
                self.send("Fetch.failRequest", self.session, requestId=rid, errorReason="BlockedByClient")
        elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append(f"exception: {d.get('exception', {}).get('description') or d['text']}")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.errors.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")

    def open(self, url):
        result = self.call("Page.navigate", self.session, url=url)
        assert "errorText" not in result, result

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def wait_for(self, expression, timeout=30):
        """The first truthy value of a JS expression, polled while events are handled."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.evaluate(expression):
                return value
            self.pump(0.2)
        raise AssertionError(f"timed out waiting for {expression}; errors: {self.errors}; "
                             f"at {self.evaluate('location.href')}")

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", self.session, format="png")["data"]))
        return path

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - whatever state it is in, it must go
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.out.close()
        self.log.close()


@pytest.fixture
def site(published, tmp_path, request):
    """The published html/ on a local server (random free port), CDN files from npm."""
    chromium, npm = need("chromium"), need("npm")
    html = published / "html"
    assets = Npm(npm, Path(request.config.cache.mkdir("npm-cdn")))
    index, relaxed = relax_integrity((html / "index.html").read_text(), assets.resolve)
    assert len(relaxed) <= 5, relaxed  # flot (4 files) and stupidtable only: the rest are the CDN's own bytes

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if urlsplit(self.path).path in ("/", "/index.html"):
                body = index.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser(chromium, tmp_path / "profile", tmp_path / "chromium.log", origin, assets.resolve)
    try:
        yield browser, origin, html
    finally:
        browser.close()
        server.shutdown()
        server.server_close()


def assert_screenshot(path: Path):
    image = matplotlib.image.imread(path)
    assert path.stat().st_size > 10_000 and image.shape[0] >= 600 and image.shape[1] >= 1000
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 50, f"{path} is nearly blank"


def test_site_renders_in_chromium(site, tmp_path):
    browser, origin, html = site

    # asv's front page: the summary grid filled in, the Plots link shown, a tile's graph drawn
    # (asv draws a tile once it is scrolled into view) with both commits in it.
    browser.open(origin)
    names = browser.wait_for("""(() => {
        const boxes = [...document.querySelectorAll('#summarygrid-display .benchmark-container')];
        const link = document.querySelector('#nav a[href="plots/index.html"]');
        return boxes.length && link && link.offsetParent !== null ? boxes.map(b => b.textContent) : null;
    })()""")
    assert "Heads8.track_time" in names and len(names) > 20, names
    points = browser.wait_for("""(() => {
        const tile = document.getElementById('summarygrid-bench_verify_attn.Heads8.track_time');
        tile.scrollIntoView();
        window.dispatchEvent(new Event('scroll'));
        const plot = jQuery(tile).data('plot');
        return plot && tile.querySelector('canvas.flot-base') ? plot.getData()[0].data.length : 0;
    })()""")
    assert points == 2
    assert_screenshot(browser.screenshot(tmp_path / "asv.png"))

    # A benchmark's graph page: flot drew series with points in it.
    browser.open(origin + "index.html#bench_verify_attn.Heads8.track_time_vs_naive")
    series = browser.wait_for("""(() => {
        const plot = window.jQuery && jQuery('#main-graph').data('plot');
        return plot ? plot.getData().filter(s => s.data && s.data.length).length : 0;
    })()""")
    assert series >= 1
    assert_screenshot(browser.screenshot(tmp_path / "graph.png"))

    # The link leads to the plots page, whose every image loads.
    browser.open(origin)
    browser.wait_for("document.querySelector('#nav-li-plots a') !== null")
    browser.evaluate("document.querySelector('#nav-li-plots a').click()")
    browser.wait_for("location.pathname === '/plots/index.html' && document.readyState === 'complete'")
    images = browser.wait_for("""(() => {
        const imgs = [...document.images];
        return imgs.length && imgs.every(i => i.complete)
            ? imgs.map(i => ({src: i.getAttribute('src'), alt: i.alt, width: i.naturalWidth})) : null;
    })()""")
    assert sorted(i["src"] for i in images) == sorted(p.name for p in (html / "plots").glob("*.png"))
    assert all(i["width"] > 0 and i["alt"] for i in images), images
    assert browser.evaluate("document.querySelector('a[href=\"../index.html\"]') !== null")
    assert_screenshot(browser.screenshot(tmp_path / "plots.png"))

    browser.pump(0.5)  # late errors (a failed image, a script error after load) still count
    assert browser.errors == []

    # The watch itself works: a console error and an uncaught exception are both caught.
    browser.evaluate("setTimeout(() => { console.error('canary'); throw new Error('canary'); })")
    browser.pump(0.5)
    assert len(browser.errors) == 2 and all("canary" in e for e in browser.errors), browser.errors
