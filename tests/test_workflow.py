"""The GPU workflows (.github/workflows): what they must keep, checked without GitHub.

actionlint and zizmor (.ci/run) check syntax and security rules; these tests pin what this
project relies on: actions pinned by commit, the PR check's commands and its exit code, the
GPU-kind matrix, no template expressions in shell. PyYAML comes with asv (requirements.txt).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"
PR, MAIN = WORKFLOWS / "gpu-pr.yml", WORKFLOWS / "gpu-main.yml"


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def scripts(job: dict) -> str:
    return "\n".join(s["run"] for s in steps(job) if "run" in s)


def checkout(job: dict) -> dict:
    return next(s for s in steps(job) if s.get("uses", "").startswith("actions/checkout@"))


def test_every_action_pinned_by_commit_with_its_version():
    uses = [(p.name, line.strip()) for p in WORKFLOWS.glob("*.y*ml") for line in p.read_text().splitlines()
            if re.match(r"\s*(- )?uses:", line)]
    assert uses
    for name, line in uses:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*", line), (name, line)


def test_no_template_expression_in_shell_and_no_pull_request_target():
    for path in (PR, MAIN):
        doc = load(path)
        assert "pull_request_target" not in doc["on"]
        assert doc["permissions"] == {}, "every job asks for its own permissions"
        for name, job in doc["jobs"].items():
            assert "${{" not in scripts(job), f"{path.name}:{name}: pass values through env:"
            assert job.get("timeout-minutes"), f"{path.name}:{name}"


def test_pr_job_runs_quick_continuous_then_the_report_as_status():
    doc = load(PR)
    assert list(doc["on"]) == ["pull_request"]
    job = doc["jobs"]["quick"]
    assert job["runs-on"] == ["self-hosted", "gpu", "h200"]
    assert checkout(job)["with"] == {"fetch-depth": 0, "persist-credentials": False}
    assert job["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    assert job["env"]["HEAD_SHA"] == "${{ github.event.pull_request.head.sha }}"
    run = scripts(job)
    assert "source .ci/setup_env.sh" in run
    assert re.search(r'asv continuous .*-f 1\.03 -b Quick "\$BASE_SHA" "\$HEAD_SHA"', run)
    assert re.search(r'verify_attn report .*-b Quick --factor 1\.03 "\$BASE_SHA" "\$HEAD_SHA"', run)
    assert re.search(r'verify_attn ab "\$BASE_SHA"', run) and 'git checkout -q --detach "$HEAD_SHA"' in run
    # The status: failed (2) over slower (1) over no results (3) over ok, run as the job runs it.
    rank = [line for line in run.splitlines() if line.strip().startswith(("rank()", '[ "$(rank'))]
    assert len(rank) == 2, rank
    for status, paired, worse in [(0, 1, 1), (3, 2, 2), (3, 0, 3), (1, 3, 1), (2, 1, 2), (0, 0, 0), (3, 1, 1)]:
        script = f"status={status}; paired={paired}\n" + "\n".join(rank) + "\necho $status"
        out = subprocess.run(["bash", "-eo", "pipefail", "-c", script], capture_output=True, text=True).stdout
        assert out.strip() == str(worse), (status, paired, out)
    assert '>> "$GITHUB_STEP_SUMMARY"' in run
    assert run.rstrip().endswith('exit "$status"'), "the job's status is the worse of report and ab"
    comment = doc["jobs"]["comment"]
    assert comment["needs"] == "quick" and comment["permissions"] == {"pull-requests": "write"}
    assert comment["runs-on"] == "ubuntu-latest", "the write token stays off the machine that ran the PR's code"


def test_main_runs_the_suite_per_gpu_kind_commits_once_and_publishes_pages():
    doc = load(MAIN)
    assert doc["on"]["push"]["branches"] == ["main"]
    suite = doc["jobs"]["suite"]
    assert suite["strategy"]["matrix"]["gpu"] == ["h200", "rtx-pro-6000"]
    assert suite["runs-on"] == ["self-hosted", "gpu", "${{ matrix.gpu }}"]
    assert suite["permissions"] == {"contents": "read"}
    assert checkout(suite)["with"] == {"fetch-depth": 0, "persist-credentials": False}
    assert "-m verify_attn run" in scripts(suite)
    record = doc["jobs"]["record"]
    assert record["needs"] == "suite" and record["permissions"] == {"contents": "write"}
    assert "git push" in scripts(record) and "-m verify_attn publish" in scripts(record)
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact@") and s["with"]["path"] == "html/"
               for s in steps(record))
    deploy = doc["jobs"]["deploy"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert steps(deploy)[0]["uses"].startswith("actions/deploy-pages@")


def test_runner_labels_declared_for_actionlint():
    labels = set(yaml.safe_load((WORKFLOWS.parent / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    assert {"gpu", "h200", "rtx-pro-6000"} <= labels
