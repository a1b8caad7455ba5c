"""asv's JavaScript and CSS, served from the published site itself: a site that works offline.

asv's pages load jQuery, flot, bootstrap, blueimp-md5 and stupidtable from three CDNs. The
same releases, taken from the npm registry, are kept in ``site_assets/`` next to this module
(the files the pages load and ``manifest.json``: CDN URL -> npm package@version, the path
inside the package, sha256). ``publish`` copies them to ``html/vendor/`` and points every
page at them (``vendor``: no network); ``python -m verify_attn publish --fetch-assets``
refreshes them from the registry (``fetch``: needs npm), after an asv upgrade for instance.

Where the CDN's file is not what the registry ships: cdnjs serves minified builds of its own
of flot 0.8.3 (``jquery.flot*.min.js``), which no package holds byte for byte, so the same
release unminified from npm's ``flot@0.8.3``; stupidtable 1.0.1 never reached npm, whose
only release is ``stupid-table-plugin@1.1.3`` (same API: ``stupidtable()``, ``stupidsort()``).
The tags of those drop their ``integrity`` attribute; the others keep theirs, which the
browser then checks against the vendored bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent / "site_assets"
MANIFEST = "manifest.json"
VENDOR = "vendor"  # html/vendor/<package@version>/<path inside the package>

# cdnjs serves minified builds of its own, which no registry ships byte for byte: the same
# release from npm, unminified where npm has no minified file.
CDNJS = {"flot": lambda ver, f: (f"flot@{ver}", f.replace(".min.js", ".js"),
                                 "cdnjs's own minified build; the same release, unminified, from npm"),
         "stupidtable": lambda ver, f: ("stupid-table-plugin@1.1.3", f,
                                        f"stupidtable {ver} never reached npm; its only npm release, 1.1.3"),
         "blueimp-md5": lambda ver, f: (f"blueimp-md5@{ver}", f, "")}

# A tag that makes the browser load what its src= or href= names (<a> only navigates).
TAG = re.compile(r"<(?!a[\s>])[a-zA-Z][^>]*>", re.S)
ATTR = re.compile(r"""(\s(?:src|href)\s*=\s*)(["'])(.*?)\2""", re.S)
REMOTE = re.compile(r"(?:https?:)?//", re.I)
REL = re.compile(r"""\srel\s*=\s*(["'])(.*?)\1""", re.S | re.I)
LINKS_ONLY = {"alternate", "author", "bookmark", "canonical", "help", "license", "next", "prev", "search"}


class UnknownAsset(Exception):
    """A page loads something from another site that site_assets/ has no copy of."""


def npm_source(url: str) -> tuple[str, str, str] | None:
    """(npm package@version, path inside the package, note) for a CDN URL, or None."""
    u = urlsplit(url)
    if u.netloc == "code.jquery.com" and (m := re.fullmatch(r"/jquery-([\d.]+)\.min\.js", u.path)):
        return f"jquery@{m[1]}", "dist/jquery.min.js", ""
    if u.netloc == "cdn.jsdelivr.net" and (m := re.fullmatch(r"/npm/((?:@[^/]+/)?[^@/]+@[^/]+)/(.+)", u.path)):
        return m[1], m[2], ""
    if u.netloc == "cdnjs.cloudflare.com" and (m := re.fullmatch(r"/ajax/libs/([^/]+)/([^/]+)/(.+)", u.path)):
        return CDNJS[m[1]](m[2], m[3]) if m[1] in CDNJS else None
    return None


def remote_urls(page: str) -> list[str]:
    """The URLs of other sites that a page's tags load (scripts, stylesheets, images...)."""
    return [a[3] for tag in TAG.finditer(page) if not links_only(tag[0])
            for a in ATTR.finditer(tag[0]) if REMOTE.match(a[3])]


def links_only(tag: str) -> bool:
    """A <link> that only names another page (rel="alternate" and the like): nothing loads."""
    rel = REL.search(tag)
    return tag[:5].lower() == "<link" and rel is not None and set(rel[2].lower().split()) <= LINKS_ONLY


def asv_pages() -> list[Path]:
    """The html pages of the installed asv's site template, which asv publish copies."""
    import asv

    return sorted((Path(asv.__file__).parent / "www").glob("*.html"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sri_ok(body: bytes, integrity: str) -> bool:
    """Whether a subresource-integrity value (any of its hashes) matches these bytes."""
    for token in integrity.split():
        algo, _, digest = token.partition("-")
        if algo in ("sha256", "sha384", "sha512") and \
                base64.b64encode(hashlib.new(algo, body).digest()).decode() == digest.split("?")[0]:
            return True
    return False


def manifest(assets: Path = HERE) -> dict:
    return json.loads((assets / MANIFEST).read_text())["files"]


# ---------------------------------------------------------------------------------------
# publish: no network.

def vendor(html: Path, assets: Path = HERE) -> list[Path]:
    """Copy the vendored files to html/vendor/ and point every html page under html/ at them.
    Raises UnknownAsset naming the first URL of another site a page loads that site_assets/
    has no copy of. Returns the pages rewritten."""
    files = manifest(assets)
    pages = sorted(p for p in html.rglob("*.html") if VENDOR not in p.relative_to(html).parts)
    texts = {page: page.read_text() for page in pages}
    for page, text in texts.items():  # refuse before writing anything
        for url in remote_urls(text):
            if url not in files:
                raise UnknownAsset(f"{page.relative_to(html)} loads {url}, which verify_attn_tools/site_assets/ has "
                                   "no copy of (see python -m verify_attn publish --fetch-assets)")
    out = html / VENDOR
    shutil.rmtree(out, ignore_errors=True)
    bodies = {}
    for url, entry in files.items():
        body = (assets / entry["file"]).read_bytes()
        if sha256(body) != entry["sha256"]:
            raise UnknownAsset(f"verify_attn_tools/site_assets/{entry['file']} does not match its sha256 in "
                               f"{MANIFEST} (python -m verify_attn publish --fetch-assets restores it)")
        (out / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
        (out / entry["file"]).write_bytes(body)
        bodies[url] = body
    rewritten = []
    for page, text in texts.items():
        prefix = Path(os.path.relpath(out, page.parent)).as_posix()

        def local(tag):
            urls = [a[3] for a in ATTR.finditer(tag[0]) if a[3] in files]
            if not urls:
                return tag[0]
            new = ATTR.sub(lambda a: a[1] + a[2] + (f"{prefix}/{files[a[3]]['file']}" if a[3] in files else a[3]) + a[2],
                           tag[0])
            integrity = re.search(r"""\sintegrity\s*=\s*(["'])(.*?)\1""", new, re.S)
            if integrity and not all(sri_ok(bodies[url], integrity[2]) for url in urls):
                new = new.replace(integrity[0], "")  # not the CDN's very bytes: the browser would refuse them
            return new

        new_text = TAG.sub(local, text)
        if new_text != text:
            page.write_text(new_text)
            rewritten.append(page)
    return rewritten


# ---------------------------------------------------------------------------------------
# --fetch-assets: the maintainer's command, needs npm and the registry.

def npm_pack(npm: str, spec: str, into: Path) -> Path:
    """The folder of an npm package unpacked (`npm pack`, then the tarball's one top folder)."""
    dest = into / spec.replace("/", "+")
    if not dest.exists():
        proc = subprocess.run([npm, "pack", "--silent", "--pack-destination", str(into), spec],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise UnknownAsset(f"npm pack {spec} exited {proc.returncode}: {' '.join(proc.stderr.split())[-400:]}")
        with tarfile.open(into / proc.stdout.split()[-1]) as tar:
            tar.extractall(dest, filter="data")
    (top,) = dest.iterdir()  # npm tarballs hold one folder, usually package/
    return top


def fetch(npm: str | None = None, pages: list[Path] | None = None, assets: Path = HERE) -> dict:
    """Rewrite site_assets/ from the npm registry: every URL of another site that asv's pages
    load, mapped by npm_source. Returns the new manifest's files."""
    npm = npm or shutil.which("npm")
    if npm is None:
        raise UnknownAsset("--fetch-assets needs npm (and the npm registry)")
    integrity = {}
    for page in pages if pages is not None else asv_pages():
        for tag in TAG.finditer(page.read_text()):
            sri = re.search(r"""\sintegrity\s*=\s*(["'])(.*?)\1""", tag[0], re.S)
            for url in remote_urls(tag[0]):
                integrity[url] = sri[2] if sri else None
    files = {}
    with tempfile.TemporaryDirectory(prefix="verify-attn-npm-") as tmp:
        for url in sorted(integrity):
            src = npm_source(url)
            if src is None:
                raise UnknownAsset(f"no npm package known for {url}: add it to npm_source in {__file__}")
            spec, path, note = src
            body_path = npm_pack(npm, spec, Path(tmp)) / path
            if not body_path.is_file():
                raise UnknownAsset(f"{url}: npm's {spec} has no {path}")
            body = body_path.read_bytes()
            files[url] = {"package": spec, "path": path, "file": f"{spec.replace('/', '+')}/{path}",
                          "sha256": sha256(body), "bytes": len(body),
                          "same_as_cdn": bool(integrity[url]) and sri_ok(body, integrity[url])}
            if note:
                files[url]["note"] = note
        staged = assets.parent / (assets.name + ".new")
        shutil.rmtree(staged, ignore_errors=True)
        for url, entry in files.items():
            (staged / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(npm_pack(npm, entry["package"], Path(tmp)) / entry["path"], staged / entry["file"])
        (staged / MANIFEST).write_text(json.dumps(
            {"about": "asv's CDN files, from the npm registry; written by python -m verify_attn publish --fetch-assets "
                      "(verify_attn_tools/assets.py), copied to html/vendor/ by publish",
             "files": files}, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(assets, ignore_errors=True)
        staged.rename(assets)
    return files
