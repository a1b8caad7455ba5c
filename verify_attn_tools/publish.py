"""Publish results/ into html/: asv's site, the plots in html/plots/, a link between them.

Needs no GPU, re-runs nothing and needs no network. asv publish rewrites html/ from scratch every time, so the plots are
redrawn and the "Plots" link injected into its front page after every publish, and asv's JavaScript and CSS, which its
pages load from CDNs, are copied into html/vendor/ from verify_attn_tools/site_assets/ and the pages pointed at them:
the site works offline. A page loading a URL that site_assets/ has no copy of (a new asv release) fails publish.
--fetch-assets (needs npm and the npm registry) refreshes site_assets/ from the npm packages of those URLs.

Markup never reaches asv's pages from data: git tag names, benchmarks' pretty_name, code and
unit, and the machines' descriptions are HTML-escaped in html/index.json (asv inserts them as
HTML); a benchmark or parameter name that is not plain letters, digits, _ . - fails publish.
Malformed results files fail publish (exit 4, one line naming the file and the field) before
anything is written, and the site is built aside and swapped in whole: html/ is never
half-written.

The regressions page judges only the series asv.conf.json names, and leaves out the steps that benchmarks/accepted.json
accepts (verify_attn_tools/regressions.py); a malformed accepted.json fails publish before html/ is touched. Graph
points and regressions link to their commits: $VERIFY_ATTN_COMMIT_URL, else the GitHub repository of origin.
"""

from __future__ import annotations

import functools
import html as htmllib
import http.server
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import LOCAL, LOCAL_DIR, ROOT, assets, history, plots, regressions, report
from .cli import parser

SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
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


def fill_missing_graphs(html: Path) -> list[Path]:
    """The same for the benchmark pages the summary grid links to: asv's graph page fetches
    graphs/<machine, python, branch...>/<name>.json for every combination it lists; an empty
    series where asv wrote none, instead of a failed request (a 404 in the console)."""
    from asv.graph import Graph

    index = json.loads((html / "index.json").read_text())
    missing = [html / (Graph.get_file_path(params, name) + ".json")
               for params in index.get("graph_param_list", []) for name in index["benchmarks"]]
    missing = [path for path in missing if not path.exists()]
    for path in missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[]")
    return missing


class UnsafeName(Exception):
    """A benchmark or parameter name asv's pages would put into HTML unescaped (its file paths
    and URL fragments too): publish refuses it in one line."""


def escape_markup(site: Path) -> list[str]:
    """Neutralize what asv's pages insert as HTML from index.json (asv escapes parameter values,
    not these): git tag names (the graph page's tag labels), benchmarks' pretty_name (the front
    page's tiles, the graph page's tree), code and unit (tooltips, axis labels), the machines'
    descriptions (tooltips). Each is HTML-escaped, so it shows as the text it is: identity for a
    string without &, < or >. A benchmark or parameter name with other characters than letters,
    digits, _ . - (names are also file paths and URL fragments there) raises UnsafeName.
    Returns what was escaped."""
    path = site / "index.json"
    index = json.loads(path.read_text())
    changed = []

    def esc(what: str, value):
        if not isinstance(value, str):
            return value
        safe = htmllib.escape(value, quote=False)
        if safe != value and not what.endswith(".code"):  # code: every "<" of a comparison
            changed.append(what)
        return safe

    index["tags"] = {esc(f"tag {tag!r}", tag): rev for tag, rev in (index.get("tags") or {}).items()}
    for name, bm in (index.get("benchmarks") or {}).items():
        if not SAFE_NAME.fullmatch(name):
            raise UnsafeName(f"benchmark name {name!r} holds characters asv's pages would run as HTML")
        for pname in bm.get("param_names") or []:
            if not isinstance(pname, str) or not SAFE_NAME.fullmatch(pname):
                raise UnsafeName(f"parameter name {pname!r} of {name} holds characters asv's pages would run as HTML")
        for field in ("pretty_name", "code", "unit"):
            if field in bm:
                bm[field] = esc(f"{name}.{field}", bm[field])
    index["machines"] = {machine: {esc(f"machine {machine!r} key", k): esc(f"machine {machine!r}.{k}", v)
                                   for k, v in (info.items() if isinstance(info, dict) else ())}
                         for machine, info in (index.get("machines") or {}).items()}
    path.write_text(json.dumps(index, separators=(",", ":")))
    for what in changed:
        logging.getLogger("verify_attn.publish").warning("escaped markup in %s", what)
    return changed


def swap_in(site: Path, html: Path) -> None:
    """Replace html/ by the finished site: two renames within one file system, the old site
    removed after; html/ is never a half-written tree."""
    old = site.parent / "old-html"
    html.parent.mkdir(parents=True, exist_ok=True)
    if html.exists():
        os.replace(html, old)
    try:
        os.replace(site, html)
    except OSError:
        if old.exists() and not html.exists():
            os.replace(old, html)
        raise
    shutil.rmtree(old, ignore_errors=True)


def asv_config(root: Path) -> dict:
    """asv.conf.json, with the address of the commit pages where one is known."""
    from asv import util

    conf = util.load_json(str(root / "asv.conf.json"), js_comments=True)
    url = regressions.commit_url(root)
    if url:
        conf["show_commit_url"] = url
    return conf


def local_config(root: Path = ROOT, html_dir: Path | None = None) -> Path:
    """asv.conf.json with results and html under .asv/local/ (git-ignored): the run and the
    site of a machine the repository does not track (html_dir: publish into it instead)."""
    conf = asv_config(root)
    conf.update(results_dir=f"{LOCAL_DIR}/results", html_dir=str(html_dir) if html_dir else f"{LOCAL_DIR}/html")
    # Beside asv.conf.json: asv reads the paths of a configuration, the plugin's too, from
    # the directory it lies in.
    path = root / ".asv-local.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def tracked_config(root: Path = ROOT, html_dir: Path | None = None) -> Path:
    """asv.conf.json with the steps of benchmarks/accepted.json accepted, for the tracked site.
    Only there: they are decisions about the tracked history, whose commits a local site's
    checkout (a copy, a shallow clone) may lack. Raises regressions.AcceptedError before writing."""
    conf = asv_config(root)
    conf["regressions_first_commits"] = {**conf.get("regressions_first_commits", {}),
                                         **regressions.accepted_rules(root, conf["branches"])}
    # In .asv/ (git-ignored). asv runs from a configuration's directory: the paths made
    # absolute; the plugin is still found, `python -m asv` from the checkout has it on sys.path.
    conf.update({key: str(root / conf[key]) for key in ("repo", "benchmark_dir", "env_dir", "results_dir", "html_dir")})
    if html_dir:
        conf["html_dir"] = str(html_dir)
    path = root / ".asv" / "publish.conf.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(conf, indent=1))
    return path


def publish(root: Path = ROOT, local: bool = False) -> int:
    """Publish the tracked machines' results/ into html/, or (local) .asv/local/ into its site.

    The results files are checked first (a malformed one: exit 4, one line naming the file and
    the field); the site is built in a temporary directory under .asv/ and swapped in only
    when complete, so a failure leaves the previous html/ as it was."""
    base = root / LOCAL_DIR if local else root
    html = base / "html"
    try:
        report.check_results_dir(base / "results")
    except report.Malformed as exc:
        print(f"python -m verify_attn publish: {exc}", file=sys.stderr)
        return report.MALFORMED_EXIT
    if not local:  # a malformed benchmarks/accepted.json refuses before anything is written
        try:
            regressions.accepted_rules(root, asv_config(root)["branches"])
        except regressions.AcceptedError as exc:
            print(f"python -m verify_attn publish: {exc}", file=sys.stderr)
            return 1
    (root / ".asv").mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="publish-", dir=root / ".asv"))
    site = staging / "html"
    try:
        config = local_config(root, site) if local else tracked_config(root, site)
        status = subprocess.call([sys.executable, "-m", "asv", "--config", str(config), "publish"], cwd=root)
        if not (site / "index.html").exists():
            return status or 1
        fill_missing_summaries(site)
        fill_missing_graphs(site)
        plots.main(base / "results", site / "plots")
        inject_link(site / "index.html")
        try:
            escape_markup(site)
            assets.vendor(site)
        except (assets.UnknownAsset, UnsafeName) as exc:
            print(f"python -m verify_attn publish: {exc}", file=sys.stderr)
            return 1
        swap_in(site, html)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not local:
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
    p.add_argument("--local", action="store_true",
                   help="publish .asv/local/ (the runs of a machine this repository does not track) into "
                        ".asv/local/html instead")
    p.add_argument("--fetch-assets", action="store_true",
                   help="only refresh verify_attn_tools/site_assets/ (asv's CDN files) from the npm registry with "
                        "`npm pack` (needs npm), for instance after an asv upgrade; publishes nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.fetch_assets:
        try:
            files = assets.fetch()
        except assets.UnknownAsset as exc:
            print(f"python -m verify_attn publish: {exc}", file=sys.stderr)
            return 1
        for url, entry in sorted(files.items(), key=lambda kv: kv[1]["file"]):
            print(f"{entry['file']:58s} {entry['bytes']:7d} B  {url}")
        print(f"{len(files)} files in {assets.HERE}")
        return 0
    status = publish(local=args.local)
    html = LOCAL / "html" if args.local else ROOT / "html"
    if args.serve is not None and (html / "index.html").exists():
        serve(html, args.serve)
    return status

