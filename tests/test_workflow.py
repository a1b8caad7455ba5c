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
    assert job["if"] == "github.event.pull_request.head.repo.full_name == github.repository", "no fork's code"
    assert checkout(job)["with"] == {"fetch-depth": 0, "persist-credentials": False, "clean": True}
    assert job["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    assert job["env"]["HEAD_SHA"] == "${{ github.event.pull_request.head.sha }}"
    run = scripts(job)
    assert "source .ci/setup_env.sh" in run
    assert "factor=${VERIFY_ATTN_FACTOR:-1.03}" in run, "1.03 unless CPU mode (tests/test_act.py) widens it"
    assert "set +e -uo pipefail" in run, "shell: bash runs with -e: the exit codes are collected"
    assert re.search(r'asv continuous .*-f "\$factor" -b Quick "\$BASE_SHA" "\$HEAD_SHA"', run)
    # One comment, one verdict: ab runs where kernels/ changed (in the head's own checkout) and
    # report composes the comment from asv's results and ab's rows (README "CI on GPU runners").
    assert re.search(r'verify_attn report .*-b Quick --factor "\$factor" \$\{ab_json:\+--ab "\$ab_json"\} \\\n\s*'
                     r'"\$BASE_SHA" "\$HEAD_SHA" > pr-report/report\.md', run)
    assert re.search(r'verify_attn ab \$\{VERIFY_ATTN_AB_FACTOR:\+-f "\$VERIFY_ATTN_AB_FACTOR"\} "\$BASE_SHA" --json pr-report/ab\.json', run)
    assert 'if ! git diff --quiet "$BASE_SHA" "$HEAD_SHA" -- kernels; then' in run
    assert run.index("git diff --quiet") < run.index('git checkout -q --detach "$HEAD_SHA"') < run.index("verify_attn ab ")
    assert run.index("verify_attn ab ") < run.index('git checkout -q --detach "$merge"') < run.index("verify_attn report")
    no_report = run.split("if [ ! -s pr-report/report.md ]")[1]
    assert re.search(r"\{[^}]*cat pr-report/ab\.md[^}]*\} >> pr-report/report\.md", no_report), \
        "ab's table joins the comment only where report wrote none"
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
    assert comment["needs"] == "quick"
    assert comment["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert comment["runs-on"] == "ubuntu-latest", "the write token stays off the machine that ran the PR's code"
    # The sanitizer is the base's (never the head's code), and the comment is what it wrote.
    assert checkout(comment)["with"] == {"ref": "${{ github.event.pull_request.base.sha }}",
                                         "persist-credentials": False}
    assert "python3 verify_attn_tools/sanitize.py < report.md > safe.md" in scripts(comment)
    script = next(s["with"]["script"] for s in steps(comment) if s.get("uses", "").startswith("actions/github-script@"))
    assert "readFileSync('safe.md'" in script and "report.md" not in script


def all_jobs():
    for path in (PR, MAIN):
        for name, job in load(path)["jobs"].items():
            yield path.name, name, job


def test_write_permissions_only_on_hosted_runners_and_no_persisted_credentials():
    for path, name, job in all_jobs():
        writes = [k for k, v in (job.get("permissions") or {}).items() if v == "write"]
        if writes:
            assert job["runs-on"] == "ubuntu-latest", (path, name, writes)
        for step in steps(job):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, (path, name)


def test_self_hosted_jobs_keep_their_caches_in_the_runner_temp_dir():
    self_hosted = [(p, n, j) for p, n, j in all_jobs() if "self-hosted" in j["runs-on"]]
    assert {(p, n) for p, n, _ in self_hosted} == {("gpu-pr.yml", "quick"), ("gpu-main.yml", "suite")}
    for path, name, job in self_hosted:
        assert checkout(job)["with"]["clean"] is True, "asv's environments (.asv/env) live in the workspace"
        for step in steps(job):
            if "run" in step:
                env = step.get("env", {})
                for var in ("HOME", "XDG_CACHE_HOME", "PIP_CACHE_DIR", "VERIFY_ATTN_CACHE"):
                    assert env.get(var, "").startswith("${{ runner.temp }}/"), (path, name, var)
                # The device is the runner's (CPU mode for act: tests/test_act.py), cuda by default.
                assert '--device "${VERIFY_ATTN_DEVICE:-cuda}"' in step["run"], (path, name)


def test_main_runs_the_suite_per_gpu_kind_commits_once_and_publishes_pages():
    doc = load(MAIN)
    assert doc["on"]["push"]["branches"] == ["main"]
    suite = doc["jobs"]["suite"]
    assert suite["strategy"]["matrix"]["gpu"] == ["h200", "rtx-pro-6000"]
    assert suite["runs-on"] == ["self-hosted", "gpu", "${{ matrix.gpu }}"]
    assert suite["permissions"] == {"contents": "read"}
    assert checkout(suite)["with"] == {"fetch-depth": 0, "persist-credentials": False, "clean": True}
    assert "-m verify_attn run" in scripts(suite)
    upload = next(s for s in steps(suite) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"].splitlines() == [
        "results/benchmarks.json", "results/${{ steps.run.outputs.machine }}/machine.json",
        "results/${{ steps.run.outputs.machine }}/${{ steps.run.outputs.sha8 }}-*.json"], "this commit's file only"
    record = doc["jobs"]["record"]
    assert record["needs"] == "suite" and record["permissions"] == {"contents": "write"}
    assert record["runs-on"] == "ubuntu-latest"
    run = scripts(record)
    # The artifacts are checked (stdlib only: the hosted runner has no torch) before anything is committed.
    check = run.index('python3 verify_attn_tools/artifacts.py --commit "$GITHUB_SHA" "${artifacts[@]}"')
    assert check < run.index("cp -R") < run.index("git add results/") < run.index("push -q origin HEAD:main")
    assert "set -euo pipefail" in run
    site = doc["jobs"]["site"]
    assert site["needs"] == "record" and site["permissions"] == {"contents": "read"}
    assert checkout(site)["with"]["ref"] == "${{ needs.record.outputs.sha }}"
    assert "-m verify_attn publish" in scripts(site)
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact@") and s["with"]["path"] == "html/"
               for s in steps(site))
    deploy = doc["jobs"]["deploy"]
    assert deploy["needs"] == "site"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert steps(deploy)[0]["uses"].startswith("actions/deploy-pages@")


def test_runner_labels_declared_for_actionlint():
    labels = set(yaml.safe_load((WORKFLOWS.parent / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    assert {"gpu", "h200", "rtx-pro-6000"} <= labels
