"""Which commits changed measured code, and which of those lack results (holes).

A commit needs results on a machine when it changed a measured path (the kernels, the
measured package verify_attn, the suite, the asv plugin and settings, the packaging)
against its first parent; a commit that only touched tooling, docs, scripts, tests or
results/ measures the same code as its parent and is listed as "same". The table
lists every first-parent commit since the kernels exist. --missing prints just the hashes
that lack results (`python -m verify_attn backfill 0,1` with no commits runs those); --check exits 1 when
there are any. The table's second column says whether the commit changed measured code.
A --branch that is not a commit, or a --machine without a folder in results/, is one line
naming it (the machines there too), exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import ROOT
from .cli import parser

# git pathspecs. The command line's trampoline is tooling, and so were the modules that lived
# in verify_attn/ before the tooling got a package of its own: the old history is judged by
# the same line as the new.
MEASURED = ("kernels", "verify_attn", "benchmarks", "asv_plugins", "asv.conf.json", "pyproject.toml",
            "requirements.txt", ":(exclude)verify_attn/__main__.py", ":(exclude)benchmarks/accepted.json",
            *(f":(exclude)verify_attn/{m}.py" for m in ("history", "plots", "publish", "detect", "crosscheck")))

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # what a root commit is compared against


@dataclass
class Commit:
    sha: str
    subject: str
    measured: bool  # changed a measured path against its first parent
    has_results: bool

    @property
    def missing(self) -> bool:
        return self.measured and not self.has_results


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def changed_measured(root: Path, sha: str, parent: str | None) -> bool:
    """Whether sha changed a measured path against parent (None: a root commit)."""
    return bool(git(root, "diff", "--name-only", parent or EMPTY_TREE, sha, "--", *MEASURED).strip())


def measured_code(root: Path, sha: str) -> str:
    """The commit whose measured code sha has: sha itself where it changed a measured path,
    else its nearest first-parent ancestor that did (sha where none did)."""
    for line in git(root, "rev-list", "--first-parent", "--parents", sha).splitlines():
        commit, *parents = line.split()
        if changed_measured(root, commit, parents[0] if parents else None):
            return commit
    return sha


def machines(root: Path = ROOT) -> list[str]:
    """The asv machines of results/: its folders holding a machine.json."""
    return sorted(p.parent.name for p in (root / "results").glob("*/machine.json"))


def recorded(results: Path) -> set[str]:
    """Full hashes of the commits with results files in results/<machine>/."""
    hashes = set()
    for path in results.glob("*.json"):
        if path.name == "machine.json":
            continue
        try:
            hashes.add(json.loads(path.read_text())["commit_hash"])
        except (ValueError, KeyError) as err:
            raise SystemExit(f"{path}: not an asv results file ({err})")
    return hashes


def commits(root: Path = ROOT, machine: str = "nvidia-h200", branch: str = "HEAD") -> list[Commit]:
    """The branch's first-parent commits from the one that added kernels/, oldest first."""
    done = recorded(root / "results" / machine)
    log = [line.split("\t", 2) for line in
           git(root, "log", "--first-parent", "--reverse", "--format=%H%x09%P%x09%s", branch).splitlines()]
    with_kernels = [sha for sha, _, _ in log if git(root, "ls-tree", "--name-only", sha, "kernels").strip()]
    if not with_kernels:
        return []
    start = [sha for sha, _, _ in log].index(with_kernels[0])
    history = []
    for sha, parents, subject in log[start:]:
        parent = parents.split()[0] if parents else None
        history.append(Commit(sha, subject, changed_measured(root, sha, parent), sha in done))
    return history


def unknown(root: Path, branch: str, machine: str) -> str | None:
    """One line on what of the arguments names nothing here (a table of every commit "lacking"
    a typo's results would read as a fact), else None."""
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{branch}^{{commit}}"], cwd=root,
                      capture_output=True).returncode != 0:
        return f"unknown branch {branch!r}: not a commit of this repository"
    known = machines(root)
    if machine not in known:
        return f"unknown machine {machine!r}: results/ holds {', '.join(known) or 'none'}"
    return None


def main(argv=None) -> int:
    p = parser("history", __doc__)
    p.add_argument("--machine", default="nvidia-h200", help="the asv machine name under results/")
    p.add_argument("--branch", default="HEAD")
    p.add_argument("--missing", action="store_true", help="print only the hashes that need results")
    p.add_argument("--check", action="store_true", help="exit 1 if any commit needs results")
    args = p.parse_args(argv)
    problem = unknown(ROOT, args.branch, args.machine)
    if problem:
        print(f"python -m verify_attn history: {problem}", file=sys.stderr)
        return 2
    history = commits(ROOT, args.machine, args.branch)
    holes = [c for c in history if c.missing]
    if args.missing:
        print("\n".join(c.sha for c in holes))
    else:
        for c in history:
            state = "results" if c.has_results else ("MISSING" if c.measured else "not needed")
            print(f"{c.sha[:8]}  {'measured' if c.measured else 'same':8s}  {state:10s} {c.subject[:64]}")
        print(f"{len(holes)} of {sum(c.measured for c in history)} measured commits lack {args.machine} results")
    return 1 if args.check and holes else 0

