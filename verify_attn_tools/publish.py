"""Publish results/ into html/: asv's site, the plots in html/plots/, a link between them.

The site's first page, index.html, is the landing page (verify_attn_tools/landing.py: per
tracked machine, the newest commit against the previous one at the headline points, with
report's verdict); asv's own front page is moved to asv.html, one click away (an old
index.html#... link is forwarded there). asv's graph pages open on points that exist
(graph_defaults: Quick's prefix 65,536, a log axis where the values span a decade) instead of
each parameter's first value. With no results at all, publish says to run `python -m verify_attn
run` first (exit 3) instead of asv's advice.

Needs no GPU, re-runs nothing and needs no network. asv publish rewrites html/ from scratch every time, so the plots are
redrawn and the "Plots" link injected into its front page after every publish, and asv's JavaScript and CSS, which its
pages load from CDNs, are copied into html/vendor/ from verify_attn_tools/site_assets/ and the pages pointed at them:
the site works offline. A page loading a URL that site_assets/ has no copy of (a new asv release) fails publish.
--fetch-assets (needs npm and the npm registry) refreshes site_assets/ from the npm packages of those URLs.

asv's graph pages carry each machine's recorded details (driver, CUDA, SMs, clocks, ceilings) in
its tooltip, and commit labels where the curves are expected to step: a new anchor, an accepted
step (annotate).

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

from . import LOCAL, LOCAL_DIR, ROOT, assets, history, landing, plots, regressions, report
from .cli import parser

SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
MARK = "<!-- verify-attn: plots link -->"
NAV_ITEM = (f'{MARK}<li id="nav-li-plots"><a href="plots/index.html">Plots</a></li>'
            '<li id="nav-li-latest"><a href="index.html">Latest</a></li>')
CORNER = (f'{MARK}<a id="verify-attn-plots" href="plots/index.html" style="position:fixed;right:1em;top:.8em;'
          'z-index:2000;font-weight:bold">Plots</a>')
DEFAULTS_JS = "verify-attn-defaults.js"
DEFAULTS_MARK = "<!-- verify-attn: graph defaults -->"
# What a graph page opens on where the link names no parameters: the headline values where
# measured (else the value with the most points), every implementation measured there.
PREFERRED = {"prefix_len": 65536, "heads": 64, "q_len": 9, "batch": 32, "arch": "sm_90"}
SPREAD_FOR_LOG = 10.0  # max / min of the values shown from which the y axis opens logarithmic


def inject_link(index: Path) -> bool:
    """Add the links (the plots, the landing page) to asv's front page unless they are there
    already. Returns whether they were added."""
    text = index.read_text()
    if MARK in text:
        return False
    nav = text.find('id="nav"')
    end = text.find("</ul>", nav)
    if nav >= 0 and end >= 0:  # last items in asv's navigation bar
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


def measured_points(results_dir: Path) -> dict[str, dict]:
    """{benchmark: {parameter tuple (literal values): value}} of the points with a number in the
    newest results file of each machine under results_dir (the first machine's value where two
    have one)."""
    found: dict[str, dict] = {}
    for machine in sorted(p.parent.name for p in results_dir.glob("*/machine.json")):
        commits = landing.results_files(results_dir, machine)
        if not commits:
            continue
        for key, (_, points) in report.load(results_dir, machine, commits[-1][0]).items():
            for c, (v, _, _) in points.items():
                if not report.isna(v):
                    found.setdefault(key, {}).setdefault(c, v)
    return found


def default_selection(params: list, names: list, measured: set) -> tuple[dict, list]:
    """({parameter name: [values as asv stores them]}, the measured tuples selected) for a graph
    page: one value of each parameter but impl (the preferred one where measured, else the one
    with the most points), every implementation measured there (at most asv's 8 curves)."""
    import ast

    chosen, left = {}, set(measured)
    for i, name in enumerate(names):
        values = [ast.literal_eval(v) for v in params[i]]
        present = [v for v in values if any(c[i] == v for c in left)]
        if not present:
            return {}, []
        if name == "impl":
            keep = present[:8]
        elif PREFERRED.get(name) in present:
            keep = [PREFERRED[name]]
        else:
            keep = [max(present, key=lambda v: (sum(c[i] == v for c in left), values.index(v)))]
        left = {c for c in left if c[i] in keep}
        chosen[name] = [params[i][values.index(v)] for v in keep]
    return chosen, sorted(left, key=str)


def graph_defaults(site: Path, results_dir: Path) -> dict[str, str]:
    """Make asv's graph pages open on data: a graph link without parameters (a tile of the grid,
    the benchmark tree) opens on default_selection's points, on a log axis where their values
    span SPREAD_FOR_LOG or more, instead of asv's first values (prefix 0, which Quick does not
    time: a blank graph). Writes verify-attn-defaults.js, which rewrites such a location before
    asv's own hashchange handler reads it, and loads it from asv's page. Returns the queries."""
    from urllib.parse import quote

    index = json.loads((site / "index.json").read_text())
    measured = measured_points(results_dir)
    queries = {}
    for name, bm in (index.get("benchmarks") or {}).items():
        params, names = bm.get("params") or [], bm.get("param_names") or []
        if not params or len(params) != len(names) or name not in measured:
            continue
        chosen, points = default_selection(params, names, set(measured[name]))
        if not chosen:
            continue
        pairs = [(f"p-{k}", v) for k, vs in chosen.items() for v in vs]
        values = [measured[name][c] for c in points if measured[name][c] > 0]
        if values and max(values) / min(values) >= SPREAD_FOR_LOG:
            pairs.append(("y-axis-scale", "log"))
        queries[name] = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    script = ("// Written by python -m verify_attn publish (verify_attn_tools/publish.py, graph_defaults).\n"
              f"(function () {{\n  var D = {json.dumps(queries, sort_keys=True)};\n" + """\
  function open_on_data() {
    var h = location.hash.replace(/^#\\/?/, '');
    if (!h || h.indexOf('?') >= 0) return;
    var name = decodeURIComponent(h);
    if (Object.prototype.hasOwnProperty.call(D, name))
      history.replaceState(history.state, '', '#' + h + '?' + D[name]);
  }
  open_on_data();
  window.addEventListener('hashchange', open_on_data);  // before asv's handler: it is added later
})();
""")
    (site / DEFAULTS_JS).write_text(script)
    page = site / landing.ASV_PAGE
    text = page.read_text()
    if DEFAULTS_MARK not in text:
        head = text.find("<script")
        tag = f'{DEFAULTS_MARK}<script src="{DEFAULTS_JS}"></script>\n    '
        text = text[:head] + tag + text[head:] if head >= 0 else tag + text
        page.write_text(text)
    return queries


def annotate(site: Path, results_dir: Path, root: Path, accepted: bool = True) -> None:
    """What asv's graph pages show beside the curves, written into index.json:
    - each machine's details (driver, CUDA, SMs, clocks, power limit, ceilings, from the machine
      series of its newest results) in the machine's tooltip, where asv shows machine.json's;
    - commit labels, drawn by asv as labelled vertical lines on every time axis (its git tags'
      place): where the drift-free series start against a new anchor ("anchor <sha>"), and the
      steps benchmarks/accepted.json accepts ("accepted <sha>", at the first recorded commit from
      the accepted one on), so a reader sees why a curve steps there (accepted: False for a
      local site, whose checkout may lack those commits)."""
    from . import report

    path = site / "index.json"
    index = json.loads(path.read_text())
    rev_of = {h: int(r) for r, h in (index.get("revision_to_hash") or {}).items()}
    labels: dict[str, int] = {}
    for machine, info in (index.get("machines") or {}).items():
        commits = landing.results_files(results_dir, machine)
        if not commits or not isinstance(info, dict):
            continue
        loaded = [report.load(results_dir, machine, sha, (report.BENCH, landing.MACHINE_SUITE)) for sha, _ in commits]
        info.update(landing.machine_details(loaded[-1]))
        info["details recorded at"] = f"commit {commits[-1][0][:8]}"
        seen = None
        for (sha, _), res in zip(commits, loaded):
            versions = {v for k, (v, _) in res.items() if k.endswith(f".{report.ANCHOR}") and v}
            version = min(versions) if versions else None
            if version and version != seen and sha in rev_of:
                labels[version.replace("-", " ", 1)[:24]] = rev_of[sha]
            seen = version or seen
    branches = asv_config(root).get("branches") or []
    for entry in regressions.load_accepted(root) if accepted else []:
        # drawn at the first recorded commit that has the step, named by the accepted one
        where = entry["commit"] and regressions.first_of(root, entry["commit"], branches, rev_of)
        if where:
            sha = regressions.on_branches(root, entry["commit"], branches)
            labels[f"accepted {sha[:7]}"] = rev_of[where]
    index["tags"] = {**(index.get("tags") or {}), **labels}
    path.write_text(json.dumps(index, separators=(",", ":")))


NO_RESULTS_EXIT = 3  # as report's "record it first"


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


def publish(root: Path = ROOT, local: bool = False, html_dir: Path | None = None) -> int:
    """Publish the tracked machines' results/ into html/, or (local) .asv/local/ into its site.

    The results files are checked first (a malformed one: exit 4, one line naming the file and
    the field); the site is built in a temporary directory under .asv/ and swapped in only
    when complete, so a failure leaves the previous html/ as it was (html_dir: publish there
    instead of html/). asv's front page becomes asv.html; index.html is the landing page
    (verify_attn_tools/landing.py). No results at all: exit 3 and one line saying to run first."""
    base = root / LOCAL_DIR if local else root
    html = html_dir or base / "html"
    try:
        report.check_results_dir(base / "results")
    except report.Malformed as exc:
        print(f"python -m verify_attn publish: {exc}", file=sys.stderr)
        return report.MALFORMED_EXIT
    if not any(landing.results_files(base / "results", p.parent.name)
               for p in (base / "results").glob("*/machine.json")):
        # asv's own advice here ("asv run --bench just-discover") is not this project's way
        where = f"{LOCAL_DIR}/results" if local else "results/"
        print(f"python -m verify_attn publish: no results under {where} yet: run `python -m verify_attn run` "
              "first (it measures this machine, records the results and publishes them)", file=sys.stderr)
        return NO_RESULTS_EXIT
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
        os.replace(site / "index.html", site / landing.ASV_PAGE)
        inject_link(site / landing.ASV_PAGE)
        try:
            annotate(site, base / "results", root, accepted=not local)
            escape_markup(site)
            graph_defaults(site, base / "results")
            landing.build(base / "results", site / "index.html", asv_config(root).get("show_commit_url") or None)
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

