"""Publish results/ into html/: asv's site, the plots in html/plots/, a link between them.

Needs no GPU and re-runs nothing. asv publish rewrites html/ from scratch every time, so the plots are redrawn and the
"Plots" link injected into its front page after every publish.
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import subprocess
import sys
from pathlib import Path

from . import ROOT, history, plots
from .cli import parser
MARK = "<!-- verify-attn: plots link -->"
NAV_ITEM = f'{MARK}<li id="nav-li-plots"><a href="plots/index.html">Plots</a></li>'
CORNER = (f'{MARK}<a id="verify-attn-plots" href="plots/index.html" style="position:fixed;right:1em;top:.8em;'
          'z-index:2000;font-weight:bold">Plots</a>')


def inject_link(index: Path) -> bool:
    """Add the link to asv's front page unless it is there already. Returns whether it was added."""
    text = index.read_text()
    if MARK in text:
        return False
    nav = text.find('id="nav"')
    end = text.find("</ul>", nav)
    if nav >= 0 and end >= 0:  # a last item in asv's navigation bar
        text = text[:end] + NAV_ITEM + text[end:]
    else:  # some other asv layout: a fixed link in the corner, visible all the same
        end = text.rfind("</body>")
        text = text[:end] + CORNER + text[end:] if end >= 0 else text + CORNER
    index.write_text(text)
    return True


def fill_missing_summaries(html: Path) -> list[str]:
    """asv's front page fetches graphs/summary/<name>.json for every benchmark it knows but
    asv writes one only for benchmarks with results: an empty series for the others (Machine
    and ColdL2 on a CPU, Resources without nvcc) instead of a 404 in the console per tile."""
    summary = html / "graphs" / "summary"
    summary.mkdir(parents=True, exist_ok=True)
    missing = [name for name in json.loads((html / "index.json").read_text())["benchmarks"]
               if not (summary / f"{name}.json").exists()]
    for name in missing:
        (summary / f"{name}.json").write_text("[]")
    return missing


def publish(root: Path = ROOT) -> int:
    status = subprocess.call([sys.executable, "-m", "asv", "publish"], cwd=root)
    html = root / "html"
    if not (html / "index.html").exists():
        return status or 1
    fill_missing_summaries(html)
    plots.main(root / "results", html / "plots")
    inject_link(html / "index.html")
    warn_holes(root)
    return status


def warn_holes(root: Path) -> None:
    """Name the commits whose measured code changed but that have no results, per machine."""
    for machine in sorted(p.parent.name for p in (root / "results").glob("*/machine.json")):
        try:
            holes = [c.sha[:8] for c in history.commits(root, machine) if c.missing]
        except (OSError, subprocess.CalledProcessError):
            return  # not a git checkout: nothing to compare against
        if holes:
            logging.getLogger("verify_attn.publish").warning(
                "%s: %d commits changed measured code but have no results: %s "
                "(python -m verify_attn history --machine %s)", machine, len(holes), " ".join(holes), machine)


def serve(directory: Path, port: int) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"Serving http://127.0.0.1:{server.server_address[1]}/ (plots: /plots/), Ctrl-C to stop", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv=None) -> int:
    p = parser("publish", __doc__)
    p.add_argument("--serve", nargs="?", type=int, const=8080, metavar="PORT",
                   help="then serve html/ on localhost (default port 8080; 0 picks a free one)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    status = publish()
    if args.serve is not None and (ROOT / "html" / "index.html").exists():
        serve(ROOT / "html", args.serve)
    return status

