"""verify_attn_tools/artifacts.py: what the hosted record job accepts from a GPU runner's
artifact before committing it, run as that job runs it (python3 FILE, standard library only).
Every refusal is one line naming the file and the problem, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "verify_attn_tools" / "artifacts.py"
SHA = "0123456789abcdef0123456789abcdef01234567"
MACHINE = "nvidia-h200"


def result(sha: str = SHA, **changes) -> dict:
    doc = {"commit_hash": sha, "env_name": "reuse-py3.12", "date": 1700000000000,
           "params": {"machine": MACHINE, "python": "3.12"}, "python": "3.12", "requirements": {}, "env_vars": {},
           "result_columns": ["result", "params", "version"],
           "results": {"bench_verify_attn.Quick.track_time": [[1.0], [["'a'"]], "v"]},
           "durations": {}, "version": 2}
    doc.update(changes)
    return doc


def artifact(tmp: Path, sha: str = SHA, doc: dict | None = None) -> Path:
    root = tmp / "results-h200"
    (root / MACHINE).mkdir(parents=True)
    (root / "benchmarks.json").write_text(json.dumps({"bench_verify_attn.Quick.track_time": {"name": "x"},
                                                      "version": 2}))
    (root / MACHINE / "machine.json").write_text(json.dumps({"machine": MACHINE, "version": 1}))
    (root / MACHINE / f"{sha[:8]}-reuse-py3.12.json").write_text(json.dumps(doc or result(sha)))
    return root


def check(root: Path, commit: str | None = SHA, *, module: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "verify_attn", "artifacts"] if module else [sys.executable, "-I", str(SCRIPT)]
    return subprocess.run([*cmd, *(["--commit", commit] if commit else []), str(root)], capture_output=True,
                          text=True, cwd=ROOT if module else "/")


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_a_real_result_file_passes_as_script_and_as_verb(tmp_path):
    proc = check(artifact(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "ok (3 files" in proc.stdout
    recorded = sorted((ROOT / "results" / MACHINE).glob("*-*.json"))
    if recorded:  # one of the project's own result files, as asv wrote it (NaN included)
        sha = json.loads(recorded[0].read_text())["commit_hash"]
        root = tmp_path / "real"
        (root / MACHINE).mkdir(parents=True)
        for src, dst in [(ROOT / "results" / "benchmarks.json", root / "benchmarks.json"),
                         (ROOT / "results" / MACHINE / "machine.json", root / MACHINE / "machine.json"),
                         (recorded[0], root / MACHINE / recorded[0].name)]:
            dst.write_bytes(src.read_bytes())
        proc = check(root, sha, module=True)
        assert proc.returncode == 0, proc.stderr


def test_only_the_recorded_commit(tmp_path):
    refused(check(artifact(tmp_path), "f" * 40), f"{MACHINE}/{SHA[:8]}-reuse-py3.12.json", "not the commit being recorded")
    refused(check(artifact(tmp_path / "b"), "HEAD"), "40-digit")


@pytest.mark.parametrize("name,problem", [
    ("nested", None), ("..", "characters"), (".hidden.json", "characters"), ("a b.json", "characters"),
    ("x$(id).json", "characters"), ("notes.txt", "not benchmarks.json"), ("deadbeef-env.json", None),
])
def test_unexpected_or_unsafe_names(tmp_path, name, problem):
    root = artifact(tmp_path)
    target = root / MACHINE / name
    if name == "..":  # a name the tree cannot hold: the check of one, as a zip entry could carry it
        sys.path.insert(0, str(SCRIPT.parent))
        import artifacts
        assert not artifacts.NAME.fullmatch("..") and not artifacts.NAME.fullmatch("../x.json")
        return
    if name == "nested":
        (root / "x").mkdir()
        (root / "x" / "y").mkdir()
        refused(check(root), "x/y", "folder below")
        return
    target.write_text(json.dumps(result()))
    if name == "deadbeef-env.json":
        refused(check(root), f"{MACHINE}/deadbeef-env.json", "commit_hash")
    else:
        refused(check(root), problem)


def test_links_and_special_files(tmp_path):
    root = artifact(tmp_path)
    os.symlink("/etc/passwd", root / MACHINE / "12345678-reuse-py3.12.json")
    refused(check(root), f"{MACHINE}/12345678-reuse-py3.12.json", "a link")
    root = artifact(tmp_path / "b")
    os.symlink(tmp_path, root / "elsewhere")
    refused(check(root), "elsewhere", "a link")
    root = artifact(tmp_path / "c")
    os.mkfifo(root / MACHINE / "fifo.json")
    refused(check(root), "fifo.json", "not a plain file")


def test_size_limit(tmp_path):
    doc = result(results={"x": ["a" * (17 << 20)]})
    refused(check(artifact(tmp_path, doc=doc)), f"{MACHINE}/{SHA[:8]}-reuse-py3.12.json", "bytes, over the limit")


@pytest.mark.parametrize("change,problem", [
    ({"results": None}, "results is NoneType"),
    ({"date": "yesterday"}, "date is str"),
    ({"version": True}, "version is bool"),
    ({"commit_hash": "<img src=x>"}, "not a 40-digit sha"),
    ({"env_name": "other"}, "env_name"),
    ({"params": {"machine": "cpu-x86_64"}}, "params.machine"),
    ({"extra": 1}, "unexpected key(s) extra"),
    ({"results": {"x": [1, 2, 3, 4]}}, "not a list of at most 3"),
])
def test_json_shape(tmp_path, change, problem):
    refused(check(artifact(tmp_path, doc=result(**change))), f"{SHA[:8]}-reuse-py3.12.json", problem)


def test_missing_keys_not_json_and_machine_entry(tmp_path):
    doc = result()
    del doc["durations"], doc["env_vars"]
    refused(check(artifact(tmp_path, doc=doc)), "missing key(s) durations, env_vars")
    root = artifact(tmp_path / "b")
    (root / MACHINE / f"{SHA[:8]}-reuse-py3.12.json").write_text("{not json")
    refused(check(root), "not valid JSON")
    root = artifact(tmp_path / "c")
    (root / MACHINE / "machine.json").write_text(json.dumps({"machine": "other", "version": 1}))
    refused(check(root), f"{MACHINE}/machine.json", "not a machine entry")
    root = artifact(tmp_path / "d")
    (root / MACHINE / "machine.json").unlink()
    refused(check(root), f"{MACHINE}/machine.json: missing")
    root = artifact(tmp_path / "e")
    (root / "benchmarks.json").write_text("[]")
    refused(check(root), "benchmarks.json", "not asv's benchmarks.json")


def test_empty_artifact_and_not_a_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    refused(check(tmp_path / "empty"), "no result file")
    refused(check(tmp_path / "absent"), "not a directory")
