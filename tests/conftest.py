import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from verify_attn import ops, registry
from verify_attn.candidate import Candidate

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def extension():
    ops.load()  # build once (cached by content) before any test


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def require(impl: str, device: str, inputs=None) -> None:
    """Skip, with the registry's reason, where impl cannot run on this device or these inputs."""
    reason = ops.unsupported(impl, device) if inputs is None else Candidate(impl).skip_reason(inputs)
    if reason:
        pytest.skip(reason)


COMPILED = [n for n, i in registry.IMPLS.items() if i.compiled]


ROOT = Path(__file__).resolve().parent.parent


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def copy_files(dest: Path, history: bool = False) -> Path:
    """This checkout's tracked and new files (the work tree as it is) copied to dest; results/
    and html/ only with history, else benchmarks/accepted.json emptied too (it names commits of
    the history a copy lacks)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        if (history or not f.startswith(("results/", "html/"))) and (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    if not history:
        (dest / "benchmarks" / "accepted.json").write_text("[]")
    return dest


def checkout_copy(tmp: Path, history: bool = False) -> tuple[Path, dict]:
    """A one-commit git repository holding this checkout's tracked and new files (results/
    and html/ only with history), and the environment for asv there: CPU, the tiny grid, a
    private build cache and HOME."""
    repo = copy_files(tmp / "repo", history)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (tmp / "home").mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(tmp / "home"), VERIFY_ATTN_CACHE=str(tmp / "cache"), VERIFY_ATTN_GRID="tiny",
               VERIFY_ATTN_DEVICE="cpu", VERIFY_ATTN_BASE_PYTHON=sys.executable)
    return repo, env


# ---------------------------------------------------------------------------------------
# The site in a real browser: the system's Chromium driven through Playwright (nothing
# downloaded), offline but for the local server that serves the site.

def _missing(what: str):
    """Skip with the reason; on CI, which installs Chromium and Playwright (.ci/run), fail."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI installs it in .ci/run)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium (Playwright's Browser) on the system's binary; skipped, with the
    reason, where the binary or the playwright package is missing."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        _missing("no chromium on PATH (the browser tests drive the system Chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        _missing("the playwright package is not installed (requirements-test.txt; no browser download is needed)")
    with sync_api.sync_playwright() as pw:
        # No host name resolves but the local server's: a request the route below lets through
        # by mistake still reaches nothing.
        browser = pw.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        yield browser
        browser.close()


def serve(directory: Path):
    """(server, origin): directory on a local HTTP server at a free port, in a thread."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class Watched:
    """A page with the network cut off but for origin (and file://), and every console error,
    uncaught exception, aborted or failed request and HTTP error collected in .errors."""

    def __init__(self, browser, origin: str, width: int = 1280):
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.errors: list[str] = []
        self.origin = origin

        def route(r):
            url = r.request.url
            if url.startswith(origin) or url.startswith("file://"):
                r.continue_()
            else:
                self.errors.append(f"request to another site: {url}")
                r.abort("blockedbyclient")

        self.context.route("**/*", route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type in ("error", "assert") and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        # net::ERR_ABORTED on our own origin is a load the page cancelled (it navigated on while
        # asv's grid was still fetching its summaries, on a loaded machine): not an error; a
        # missing file still shows as its HTTP 404 below.
        self.page.on("requestfailed", lambda r: "blockedbyclient" not in (r.failure or "").lower()
                     and not (r.url.startswith(origin) and "err_aborted" in (r.failure or "").lower())
                     and self.errors.append(f"failed request: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(f"HTTP {r.status}: {r.url}"))
        self.page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"), d.dismiss()))

    def open(self, path: str):
        self.page.goto(self.origin + path)
        self.page.wait_for_load_state("load")
        return self.page

    def close(self):
        self.context.close()
