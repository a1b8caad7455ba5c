"""What the published regressions page lists: the steps nobody has accepted yet.

Which series asv judges at all is asv.conf.json's regressions_first_commits (the drift-free
track_time_vs_anchor and the errors). A step a reviewer accepted is an entry of
benchmarks/accepted.json, reviewed in the repository like code:

    [{"commit": "528910d", "series": "<regex>", "reason": "why the step is wanted"}]

`python -m verify_attn publish` adds each entry to the regressions_first_commits it publishes
with, so detection on the matching series starts after that commit and the step leaves the
page for everyone. An entry whose commit is null takes the matching series off the page for
good: a series measured to be too unsteady to judge (the reason says how it was measured).
asv matches the regex from the start of the entry name (re.match) followed
by the branch, e.g. "bench_verify_attn.Heads64.track_time_vs_anchor(9, 2048, 'tc')@main": the
parameters as asv stores them, strings quoted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ACCEPTED = "benchmarks/accepted.json"  # relative to the checkout
FIELDS = ("commit", "series", "reason")
# The remote's forms: https (credentials or not), scp-like ssh, ssh://.
GITHUB = re.compile(r"(?:https://(?:[^@/]+@)?github\.com/|(?:ssh://)?git@github\.com[:/])"
                    r"(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+?)(?:\.git)?/?")


class AcceptedError(ValueError):
    """benchmarks/accepted.json cannot be applied; the message names the entry and the field."""


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def on_branches(root: Path, commit: str, branches: list[str]) -> str | None:
    """The full hash of an abbreviated or full hash that one of the branches contains, else None:
    asv ignores, with only a warning, a first commit outside the branch."""
    sha = git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").stdout.strip()
    if sha and any(git(root, "merge-base", "--is-ancestor", sha, b).returncode == 0 for b in branches):
        return sha
    return None


def first_of(root: Path, commit: str, branches: list[str], recorded) -> str | None:
    """The first commit of the branches, from commit on (itself included), that recorded
    (a container of full hashes) holds: where a step accepted at an unrecorded commit shows in
    the history. None when no such commit is recorded yet."""
    sha = on_branches(root, commit, branches)
    if sha is None:
        return None
    if sha in recorded:
        return sha
    for branch in branches:
        later = git(root, "rev-list", "--reverse", "--ancestry-path", f"{sha}..{branch}").stdout.split()
        found = next((c for c in later if c in recorded), None)
        if found:
            return found
    return None


def accepted_between(root: Path, before: str, after: str) -> list[tuple[str, re.Pattern]]:
    """(commit, series regex) of the steps benchmarks/accepted.json accepts at a commit that
    `after` contains and `before` does not: the range a comparison of the two spans."""
    out = []
    for entry in load_accepted(root):
        if entry["commit"] is None:
            continue
        sha = on_branches(root, entry["commit"], [after])
        if sha and not on_branches(root, sha, [before]):
            out.append((entry["commit"], re.compile(entry["series"])))
    return out


def load_accepted(root: Path) -> list[dict]:
    """benchmarks/accepted.json's entries, each checked (fields, a non-empty string or a null
    commit, a series that compiles); [] without the file. Raises AcceptedError naming the entry
    and the field."""
    path = root / ACCEPTED
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except ValueError as exc:
        raise AcceptedError(f"{ACCEPTED}: not JSON: {exc}") from None
    if not isinstance(entries, list):
        raise AcceptedError(f"{ACCEPTED}: a list of entries {{{', '.join(map(repr, FIELDS))}}} expected")
    for n, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise AcceptedError(f"{ACCEPTED}, entry {n}: an object with {', '.join(map(repr, FIELDS))} expected")
        where = where_of(n, entry)
        extra = sorted(set(entry) - set(FIELDS))
        if extra:
            raise AcceptedError(f"{where}: {extra[0]!r} is not a field (fields: {', '.join(map(repr, FIELDS))})")
        for field in FIELDS:
            if field not in entry:
                raise AcceptedError(f"{where}: {field!r} is missing")
            if field == "commit" and entry[field] is None:  # never judged
                continue
            if not isinstance(entry[field], str) or not entry[field].strip():
                raise AcceptedError(f"{where}: {field!r} is not a non-empty string")
        try:
            re.compile(entry["series"])
        except re.error as exc:
            raise AcceptedError(f"{where}: 'series' is not a regular expression: {exc}") from None
    return entries


def where_of(n: int, entry: dict) -> str:
    commit = entry.get("commit")
    return f"{ACCEPTED}, entry {n}" + (f" (commit {commit})" if isinstance(commit, str) else "")


def not_judged(root: Path) -> list[re.Pattern]:
    """The series taken off the judged list for good (entries whose commit is null)."""
    return [re.compile(e["series"]) for e in load_accepted(root) if e["commit"] is None]


def accepted_rules(root: Path, branches: list[str]) -> dict[str, str | None]:
    """regressions_first_commits entries for benchmarks/accepted.json (none without the file):
    the series regex, tagged with a regex comment naming the commit (two steps accepted in one
    series stay two keys; asv starts after the latest commit that matches), to the full hash."""
    rules = {}
    for n, entry in enumerate(load_accepted(root), 1):
        commit = entry["commit"]
        if commit is None:
            rules[f"{entry['series']}(?#not judged)"] = None
            continue
        # A hash, never a name: a branch or tag would move the accepted step with it.
        sha = on_branches(root, commit, branches) if re.fullmatch(r"[0-9a-f]{7,40}", commit) else None
        if sha is None:
            raise AcceptedError(f"{where_of(n, entry)}: 'commit' {commit!r} is not the hash of a commit on "
                                f"{' or '.join(branches)}")
        rules[f"{entry['series']}(?#accepted {commit})"] = sha
    return rules


def commit_url(root: Path) -> str | None:
    """asv's show_commit_url, the address a commit's hash is appended to: $VERIFY_ATTN_COMMIT_URL
    (set and empty: none), else the repository a GitHub Actions job runs for ($GITHUB_SERVER_URL,
    $GITHUB_REPOSITORY: the workflows publish from a checkout whose origin may be a local path),
    else the commit pages of the GitHub repository that `git remote get-url origin` names, else
    None (asv's pages then link no commit)."""
    if "VERIFY_ATTN_COMMIT_URL" in os.environ:
        return os.environ["VERIFY_ATTN_COMMIT_URL"] or None
    server, repo = os.environ.get("GITHUB_SERVER_URL", ""), os.environ.get("GITHUB_REPOSITORY", "")
    if re.fullmatch(r"https://[\w.-]+(:\d+)?", server) and re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return f"{server}/{repo}/commit/"
    match = GITHUB.fullmatch(git(root, "remote", "get-url", "origin").stdout.strip())
    return f"https://github.com/{match['owner']}/{match['repo']}/commit/" if match else None
