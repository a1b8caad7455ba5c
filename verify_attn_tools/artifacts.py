"""Check an unpacked results artifact before it is committed (exit 0 ok, 2 refused).

DIR is what a GPU job of .github/workflows/gpu-main.yml uploaded, unpacked: a results
directory holding only benchmarks.json, <machine>/machine.json and
<machine>/<sha8>-<env>.json for the commit being recorded. The job that commits runs on a
GitHub-hosted runner and trusts nothing of a self-hosted runner's output: names (no `..`,
no links, nothing but letters, digits and ._-), sizes and the JSON's shape (asv's result
keys, commit_hash the recorded commit) are checked here, and the first problem is printed as
one line naming the file. Standard library only: the hosted runner runs it as
`python3 verify_attn_tools/artifacts.py --commit SHA DIR` without the project's packages
(`python -m verify_attn artifacts` is the same where they are installed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RESULT = re.compile(r"(?P<sha8>[0-9a-f]{8})-(?P<env>[A-Za-z0-9][A-Za-z0-9._-]{0,99})\.json")
RESULT_KEYS = {"commit_hash": str, "env_name": str, "date": int, "params": dict, "python": str,
               "requirements": dict, "env_vars": dict, "result_columns": list, "results": dict,
               "durations": dict, "version": int}
MAX_FILE = 16 << 20  # a full suite's result file is ~0.5 MiB; benchmarks.json ~0.2 MiB
MAX_FILES = 64


class Refused(Exception):
    """One line: the file and what is wrong with it (field: the part of the file, where one is to blame)."""

    def __init__(self, message: str, field: str | None = None, why: str | None = None):
        super().__init__(message)
        self.field, self.why = field, why


def _shape(rel: str, field: str, why: str) -> Refused:
    return Refused(f"{rel}: {field} {why}", field, why)


def load(path: Path, rel: str):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))  # asv writes NaN for a failed point
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(f"{rel}: not valid JSON ({str(exc).splitlines()[0][:120]})") from None


def check_shape(doc, rel: str) -> None:
    """asv's result-file shape: an object of exactly its eleven keys and their types, result_columns
    names, each result a list of at most that many columns. Shared with report.check_results_file
    (which adds the parameter literals and asv's own loader); raises Refused naming the field."""
    if not isinstance(doc, dict):
        raise _shape(rel, "(top level)", f"is {type(doc).__name__}, not a JSON object")
    missing = sorted(set(RESULT_KEYS) - set(doc))
    if missing:
        raise Refused(f"{rel}: missing key(s) {', '.join(missing)}", missing[0], "missing")
    extra = sorted(set(doc) - set(RESULT_KEYS))
    if extra:
        raise Refused(f"{rel}: unexpected key(s) {', '.join(extra[:5])}", extra[0], "not a key of asv's results")
    for key, kind in RESULT_KEYS.items():
        value = doc[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _shape(rel, key, f"is {type(value).__name__}, not {kind.__name__}")
    if not all(isinstance(c, str) for c in doc["result_columns"]):
        raise _shape(rel, "result_columns", "holds a non-string")
    width = len(doc["result_columns"])
    for name, row in doc["results"].items():
        if not isinstance(row, list) or len(row) > width:
            raise _shape(rel, f"results[{name[:80]!r}]", f"is not a list of at most {width} columns")


def check_result(path: Path, rel: str, machine: str, sha8: str, env: str, commit: str | None) -> None:
    doc = load(path, rel)
    check_shape(doc, rel)
    if not re.fullmatch(r"[0-9a-f]{40}", doc["commit_hash"]):
        raise Refused(f"{rel}: commit_hash {doc['commit_hash'][:60]!r} is not a 40-digit sha")
    if not doc["commit_hash"].startswith(sha8):
        raise Refused(f"{rel}: commit_hash {doc['commit_hash']} does not match the file name")
    if commit is not None and doc["commit_hash"] != commit:
        raise Refused(f"{rel}: commit_hash {doc['commit_hash']} is not the commit being recorded ({commit})")
    if doc["env_name"] != env:
        raise Refused(f"{rel}: env_name {doc['env_name'][:60]!r} does not match the file name")
    if doc["params"].get("machine") != machine:
        raise Refused(f"{rel}: params.machine {str(doc['params'].get('machine'))[:60]!r} is not the folder {machine!r}")


def check_machine(path: Path, rel: str, machine: str) -> None:
    doc = load(path, rel)
    if not isinstance(doc, dict) or doc.get("machine") != machine:
        raise Refused(f"{rel}: not a machine entry for {machine!r} (needs \"machine\": {machine!r})")
    if not isinstance(doc.get("version"), int) or isinstance(doc.get("version"), bool):
        raise Refused(f"{rel}: version is missing or not an integer")
    if any(not isinstance(v, (str, int)) or isinstance(v, bool) for v in doc.values()):
        raise Refused(f"{rel}: a value that is not a string or integer")


def check_benchmarks(path: Path, rel: str) -> None:
    doc = load(path, rel)
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        raise Refused(f"{rel}: not asv's benchmarks.json (an object with an integer version)")
    for name, entry in doc.items():
        if name != "version" and not isinstance(entry, dict):
            raise Refused(f"{rel}: entry {name[:80]!r} is not an object")


def check(root: Path, commit: str | None = None) -> list[str]:
    """Check the unpacked artifact at root; return its files (relative, sorted) or raise Refused."""
    if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise Refused(f"--commit {commit[:60]!r} is not a 40-digit sha")
    if root.is_symlink() or not root.is_dir():
        raise Refused(f"{root}: not a directory")
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if not NAME.fullmatch(name) or name in (".", ".."):
                raise Refused(f"{rel!r}: a name with characters other than letters, digits and ._- (or too long)")
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                raise Refused(f"{rel}: a link")
            if stat.S_ISDIR(mode):
                if full.parent != root:
                    raise Refused(f"{rel}: a folder below a machine's folder")
                continue
            if not stat.S_ISREG(mode):
                raise Refused(f"{rel}: not a plain file")
            size = os.lstat(full).st_size
            if size > MAX_FILE:
                raise Refused(f"{rel}: {size} bytes, over the limit of {MAX_FILE}")
            files.append((rel, full))
            if len(files) > MAX_FILES:
                raise Refused(f"{rel}: more than {MAX_FILES} files")
    results = 0
    machines = {rel.split("/")[0] for rel, _ in files if "/" in rel}
    for rel, full in files:
        parts = rel.split("/")
        if parts == ["benchmarks.json"]:
            check_benchmarks(full, rel)
        elif len(parts) == 2 and parts[1] == "machine.json":
            check_machine(full, rel, parts[0])
        elif len(parts) == 2 and (m := RESULT.fullmatch(parts[1])):
            check_result(full, rel, parts[0], m["sha8"], m["env"], commit)
            results += 1
        else:
            raise Refused(f"{rel}: not benchmarks.json, <machine>/machine.json or <machine>/<sha8>-<env>.json")
    for machine in sorted(machines):
        if not (root / machine / "machine.json").is_file():
            raise Refused(f"{machine}/machine.json: missing")
    if not results:
        raise Refused(f"{root}: no result file (<machine>/<sha8>-<env>.json)")
    return sorted(rel for rel, _ in files)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m verify_attn artifacts", description=__doc__.strip().splitlines()[0],
                                epilog="\n".join(__doc__.strip().splitlines()[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="an unpacked results artifact")
    p.add_argument("--commit", help="the 40-digit sha being recorded: every result must be of it")
    args = p.parse_args(argv)
    for d in args.dirs:
        try:
            files = check(Path(d), args.commit)
        except Refused as exc:
            print(f"artifacts: {d}: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"artifacts: {d}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            return 2
        print(f"{d}: ok ({len(files)} files: {', '.join(files)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
