"""A killed run loses nothing: SIGKILL during a benchmark and during the results write
leaves every file in results/ parseable and the earlier results byte for byte, and the
next run completes. Two processes building the extension at once produce one good library.

The write is caught in the middle by running asv in a wrapper process whose json.dump
writes half, signals, and waits: the kill then lands exactly inside asv's write.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verify_attn_tools.children import descendants
from conftest import checkout_copy, git

# asv in-process, with json.dump of results files slowed to a stop halfway through.
SLOW_WRITE = r'''
import json, os, sys, time
real_dump = json.dump
def dump(obj, fp, **kw):
    name = getattr(fp, "name", "")
    if isinstance(obj, dict) and "results" in obj and "commit_hash" in obj:
        text = json.dumps(obj, **kw)
        fp.write(text[: len(text) // 2]); fp.flush()
        open(os.environ["WRITE_MARKER"], "w").close()
        time.sleep(60)
        fp.write(text[len(text) // 2:])
        return
    real_dump(obj, fp, **kw)
json.dump = dump
from asv.main import main
sys.argv = ["asv"] + sys.argv[1:]
sys.exit(main())
'''


def parse_all(results: Path) -> dict[str, bytes]:
    files = {}
    for path in results.rglob("*.json"):
        json.loads(path.read_text())  # every file parses
        files[str(path.relative_to(results))] = path.read_bytes()
    return files


def wait_for(predicate, seconds: float, what: str):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def asv_cmd(*args):
    return [sys.executable, "-m", "asv", *args]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kill")
    repo, env = checkout_copy(tmp)
    subprocess.run(asv_cmd("machine", "--yes", "--machine", "ci"), cwd=repo, env=env, check=True, capture_output=True)
    first = subprocess.run(asv_cmd("run", "--machine", "ci", "--record-samples", "-b", "Heads8", "HEAD^!"), cwd=repo,
                           env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    with open(repo / "benchmarks" / "NOTES.txt", "a") as f:
        f.write("\nA second commit.\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "second")
    return repo, env


def kill_all(run: subprocess.Popen) -> None:
    """SIGKILL asv's group, as a lost machine would, and then what it started in sessions of
    its own (its forkserver), which would otherwise outlive the test."""
    below = descendants(run.pid)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    for pid in below:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_kill_during_a_benchmark_and_during_the_write(repo, tmp_path):
    repo, env = repo
    results = repo / "results"
    before = parse_all(results)
    assert any(name.startswith("ci/") and not name.endswith("machine.json") for name in before)

    # 1. During a benchmark: the suite's progress log says it is measuring.
    progress = Path(env["VERIFY_ATTN_CACHE"]) / "progress.log"
    progress.unlink(missing_ok=True)
    run = subprocess.Popen(asv_cmd("run", "--machine", "ci", "--record-samples", "-b", "Heads8", "HEAD^!"), cwd=repo,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: progress.exists() and progress.read_text(), 300, "a benchmark to start")
    kill_all(run)
    after = parse_all(results)
    assert {k: v for k, v in after.items() if k in before} == before, "an earlier result changed"

    # 2. During the results write.
    marker = tmp_path / "writing"
    slow = dict(env, WRITE_MARKER=str(marker))
    run = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, "run", "--machine", "ci", "--record-samples", "-b",
                            "Heads8", "HEAD^!"], cwd=repo, env=slow, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(marker.exists, 600, "the results write")
    kill_all(run)
    after = parse_all(results)
    assert {k: v for k, v in after.items() if k in before} == before, "an earlier result changed"

    # 3. The next run completes, and both commits have results.
    done = subprocess.run(asv_cmd("run", "--machine", "ci", "--record-samples", "-b", "Heads8", "HEAD^!"), cwd=repo,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    final = parse_all(results)
    hashes = {json.loads((results / k).read_text()).get("commit_hash") for k in final
              if k.startswith("ci/") and not k.endswith("machine.json")}
    assert len(hashes) == 2


def test_two_builds_at_once_make_one_good_library(tmp_path):
    env = dict(os.environ, VERIFY_ATTN_CACHE=str(tmp_path / "cache"), VERIFY_ATTN_CPU_ONLY="1")
    code = ("import torch; from verify_attn import ops; ops.load(); "
            "print(torch.ops.verify_attn.naive.default.name())")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    libs = list((tmp_path / "cache" / "lib").glob("*.so"))
    assert len(libs) == 1 and not list((tmp_path / "cache" / "lib").glob("*.tmp"))
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "verify_attn::naive" in again.stdout
