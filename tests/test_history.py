"""The history verb finds the commits that changed measured code but have no results."""

import json
import subprocess

import pytest

from verify_attn_tools import history


def commit(repo, files, message):
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", message],
                   cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    subprocess.run(["git", "init", "-q", "-b", "main", str(tmp_path)], check=True)
    shas = {
        "before": commit(tmp_path, {"README.md": "idea"}, "before the kernels"),
        "kernels": commit(tmp_path, {"kernels/k.cu": "v1"}, "the kernels"),
        "docs": commit(tmp_path, {"README.md": "docs", "tests/t.py": "x"}, "docs and tests"),
        "package": commit(tmp_path, {"verify_attn/a.py": "v2"}, "package change"),
        "config": commit(tmp_path, {"asv.conf.json": "{}"}, "asv settings"),
    }
    results = tmp_path / "results" / "gpu"
    results.mkdir(parents=True)
    (results / "machine.json").write_text("{}")
    (results / f"{shas['kernels'][:8]}-env.json").write_text(json.dumps({"commit_hash": shas["kernels"]}))
    return tmp_path, shas


def test_holes_are_the_measured_commits_without_results(repo):
    root, shas = repo
    rows = history.commits(root, "gpu")
    assert [c.sha for c in rows] == [shas[k] for k in ("kernels", "docs", "package", "config")]
    assert [c.measured for c in rows] == [True, False, True, True]
    assert [c.has_results for c in rows] == [True, False, False, False]
    assert [c.sha for c in rows if c.missing] == [shas["package"], shas["config"]]
    # results recorded for the docs commit do not hide a hole elsewhere, and fill nothing wrongly
    (root / "results" / "gpu" / "x-env.json").write_text(json.dumps({"commit_hash": shas["package"]}))
    assert [c.sha for c in history.commits(root, "gpu") if c.missing] == [shas["config"]]


def test_no_results_directory_means_every_measured_commit_is_a_hole(repo):
    root, shas = repo
    assert [c.sha for c in history.commits(root, "other") if c.missing] == [shas["kernels"], shas["package"],
                                                                            shas["config"]]


def test_cli_missing_and_check(repo, monkeypatch, capsys):
    root, shas = repo
    monkeypatch.setattr(history, "ROOT", root)
    assert history.main(["--machine", "gpu", "--missing", "--check"]) == 1
    assert capsys.readouterr().out.split() == [shas["package"], shas["config"]]
    assert history.main(["--machine", "gpu"]) == 0
    table = capsys.readouterr().out
    assert "MISSING" in table and "2 of 3 measured commits lack gpu results" in table


def test_a_file_that_is_not_asv_results_is_named(repo):
    root, _ = repo
    (root / "results" / "gpu" / "broken.json").write_text("{not json")
    with pytest.raises(SystemExit, match="broken.json: not an asv results file"):
        history.commits(root, "gpu")


def test_this_repository_has_a_history_table():
    rows = history.commits()
    assert rows and rows[0].measured  # the first commit with kernels/ changed measured code


def test_measured_code_is_the_nearest_commit_that_changed_it(repo):
    """A docs commit has its parent's measured code; a commit that changed some has its own."""
    root, shas = repo
    assert history.measured_code(root, shas["docs"]) == shas["kernels"]
    assert history.measured_code(root, shas["package"]) == shas["package"]
    assert history.measured_code(root, shas["kernels"]) == shas["kernels"]


@pytest.mark.parametrize("args, words", [(["--branch", "nosuch"], "unknown branch 'nosuch'"),
                                         (["--machine", "nosuch"], "unknown machine 'nosuch': results/ holds gpu")])
def test_an_unknown_branch_or_machine_is_one_line_exit_2(repo, monkeypatch, capsys, args, words):
    """Not a traceback, nor a table of every commit "lacking" a typo's results."""
    root, _ = repo
    monkeypatch.setattr(history, "ROOT", root)
    assert history.main(args) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert not out and len(lines) == 1 and lines[0].startswith(f"python -m verify_attn history: {words}")
