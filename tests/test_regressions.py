"""The regressions page a kernel engineer acts on: asv publish of a small results set (a git
repository of six commits, every series stepping at one of them) lists the drift-free and
correctness series only, and no step that benchmarks/accepted.json accepts; a malformed
accepted.json stops publish before html/ is touched; the commit URL is derived from origin."""

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from asv import results as asv_results, runner, util

from verify_attn_tools import publish, regressions

ROOT = Path(__file__).resolve().parent.parent
STEP = 3  # the commit every series steps at
GRID = {"params": [["9"], ["0", "2048"], ["'tc'", "'naive'"]], "param_names": ["q_len", "prefix_len", "impl"]}
SERIES = {  # name -> (parameters, unit)
    **{f"bench_verify_attn.Heads8.{m}": (GRID, "s") for m in (
        "track_time_vs_anchor", "track_error", "track_time", "track_time_vs_naive", "track_time_vs_roofline",
        "track_flops", "track_bytes", "track_roofline_time", "track_sm_clock", "track_dropped_samples",
        "track_plan_splits")},
    "bench_verify_attn.QuickCases.track_error": ({"params": [["'seed_2x64x9x521'"], ["'tc'"]],
                                                   "param_names": ["case", "impl"]}, "max_rel"),
    "bench_resources.Resources.track_registers": ({"params": [["'tc'"], ["'sm_90'"]],
                                                    "param_names": ["impl", "arch"]}, "registers"),
    "bench_machine.Machine.track_peak_tflops": ({"params": [], "param_names": []}, "TFLOP/s"),
}
JUDGED = {"bench_verify_attn.Heads8.track_time_vs_anchor", "bench_verify_attn.Heads8.track_error",
          "bench_verify_attn.QuickCases.track_error"}
SECOND = "bench_verify_attn.Heads8.track_time_vs_anchor(9, 2048, 'tc')"  # steps again at the last commit


def git(repo, *args, env=None) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


def value(name: str, n: int, point: tuple) -> float:
    """1 before STEP, 2 from it on; SECOND triples at the last commit."""
    v = 1.0 if n < STEP else 2.0
    return 3 * v if n == 5 and f"{name}({', '.join(point)})" == SECOND else v


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A checkout (the real asv.conf.json and plugin) with six commits and their results; a side branch."""
    repo = tmp_path_factory.mktemp("regressions") / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "asv.conf.json", repo)
    shutil.copytree(ROOT / "asv_plugins", repo / "asv_plugins", ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for n in range(6):  # distinct dates: a defined order
        (repo / "n.txt").write_text(str(n))
        when = f"2026-01-0{n + 1}T00:00:00"
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"commit {n}", "--date", when, env=dict(os.environ, GIT_COMMITTER_DATE=when))
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-qb", "side")
    (repo / "n.txt").write_text("side")
    git(repo, "commit", "-qam", "side")
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    (repo / "benchmarks").mkdir()

    results = repo / "results"
    (results / "gpu").mkdir(parents=True)
    (results / "gpu" / "machine.json").write_text(json.dumps({"machine": "gpu", "version": 1}))
    util.write_json(str(results / "benchmarks.json"), {
        name: {"name": name, **spec, "type": "track", "unit": unit, "version": "1", "code": "", "timeout": 60}
        for name, (spec, unit) in SERIES.items()}, api_version=2)
    for n, sha in enumerate(shas):
        res = asv_results.Results({"machine": "gpu"}, {}, sha, 1767225600000 + n * 86400000, "3.11",
                                  "reuse-py3.11", {})
        for name, (spec, _) in SERIES.items():
            vals = [value(name, n, p) for p in itertools.product(*spec["params"])]  # () without parameters
            res.add_result({"name": name, "params": spec["params"], "version": "1"},
                           runner.BenchmarkResult(vals, [None] * len(vals), [None] * len(vals), 0, "", None))
        res.save(str(results))
    return repo, shas, side


def listed(repo: Path) -> dict[str, list[str]]:
    """regressions.json as {entry name: the commits its steps land on}."""
    html = repo / "html"
    hashes = json.loads((html / "index.json").read_text())["revision_to_hash"]
    return {name: [hashes[str(jump[1])] for jump in jumps]
            for name, _, _, _, _, _, jumps in json.loads((html / "regressions.json").read_text())["regressions"]}


def test_only_judged_series_and_no_accepted_step(site, monkeypatch):
    repo, shas, _ = site
    monkeypatch.setenv("VERIFY_ATTN_COMMIT_URL", "https://example.org/c/")
    assert not (repo / regressions.ACCEPTED).exists()  # no file: nothing accepted
    assert publish.publish(repo) == 0
    before = listed(repo)
    assert {re.sub(r"\(.*", "", name) for name in before} == JUDGED, sorted(before)
    assert len(before) == 4 + 4 + 1  # every point of the judged series
    assert before[SECOND] == [shas[STEP], shas[5]]
    assert all(steps == [shas[STEP]] for name, steps in before.items() if name != SECOND)
    assert json.loads((repo / "html" / "index.json").read_text())["show_commit_url"] == "https://example.org/c/"

    # tc's anchor step accepted (a short hash): gone from tc's points, its later step at the
    # last commit still listed; naive's points and the errors stay.
    (repo / regressions.ACCEPTED).write_text(json.dumps([{
        "commit": shas[STEP][:7], "series": r"bench_verify_attn\.\w+\.track_time_vs_anchor\(.*'tc'\)",
        "reason": "wanted"}]))
    assert publish.publish(repo) == 0
    after = listed(repo)
    assert after == {**{k: v for k, v in before.items() if not (k.endswith("'tc')") and "vs_anchor" in k)},
                     SECOND: [shas[5]]}
    rules = json.loads((repo / ".asv" / "publish.conf.json").read_text())["regressions_first_commits"]
    own = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)["regressions_first_commits"]
    tagged = rf"bench_verify_attn\.\w+\.track_time_vs_anchor\(.*'tc'\)(?#accepted {shas[STEP][:7]})"
    assert rules == {**own, tagged: shas[STEP]}
    # The generated configuration is no file of the repository's.
    assert subprocess.run(["git", "check-ignore", "-q", ".asv/publish.conf.json"], cwd=ROOT).returncode == 0


def test_a_series_not_judged_leaves_the_page(site):
    """An entry with commit null: the matching series off the page for good, the rest stays."""
    repo, shas, _ = site
    (repo / regressions.ACCEPTED).write_text(json.dumps([{
        "commit": None, "series": r"bench_verify_attn\.\w+\.track_time_vs_anchor\(.*'naive'\)", "reason": "unsteady"}]))
    assert publish.publish(repo) == 0
    left = listed(repo)
    assert left and not any("vs_anchor" in k and k.endswith("'naive')") for k in left)
    assert any(k.endswith("'tc')") for k in left)
    (repo / regressions.ACCEPTED).unlink()


def test_the_repository_judges_only_drift_free_and_error_series():
    """asv.conf.json over every benchmark the repository records: a name is judged unless a
    null rule matches it (asv's rule, branch appended)."""
    rules = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)["regressions_first_commits"]
    names = [n for n in json.loads((ROOT / "results" / "benchmarks.json").read_text()) if n != "version"]
    judged = {n for n in names
              if not any(v is None and re.match(k, f"{n}(9, 'tc')@main") for k, v in rules.items())}
    assert judged == {n for n in names if re.search(r"\.track_(time_vs_anchor|error)$", n)}
    assert "bench_verify_attn.QuickCases.track_error" in judged and len(judged) >= 7


def test_the_repository_accepted_steps_apply():
    if git(ROOT, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("a shallow clone lacks the accepted commits")
    rules = regressions.accepted_rules(ROOT, ["HEAD"])  # a pull request's checkout has no branch main
    entries = json.loads((ROOT / regressions.ACCEPTED).read_text())
    assert len(rules) == len(entries) and all(len(e["reason"]) > 40 for e in entries)


@pytest.mark.parametrize("text, message", [
    ("[{", "benchmarks/accepted.json: not JSON"),
    ('{"commit": "abc1234"}', "benchmarks/accepted.json: a list of entries"),
    ('["abc1234"]', "entry 1: an object with 'commit', 'series', 'reason' expected"),
    ('[GOOD, {"commit": "MAIN7", "series": "x"}]', "entry 2 (commit MAIN7): 'reason' is missing"),
    ('[{"commit": "MAIN7", "series": "x", "reason": " "}]', "entry 1 (commit MAIN7): 'reason' is not a non-empty"),
    ('[{"commit": 528910, "series": "x", "reason": "r"}]', "entry 1: 'commit' is not a non-empty string"),
    ('[{"commit": "MAIN7", "reason": "r"}]', "'series' is missing"),
    ('[{"commit": "MAIN7", "series": "x", "reason": "r", "reasons": "r"}]', "'reasons' is not a field"),
    ('[{"commit": "MAIN7", "series": "track_(time", "reason": "r"}]',
     "entry 1 (commit MAIN7): 'series' is not a regular expression: missing ), unterminated subpattern"),
    ('[GOOD, {"commit": "1234567", "series": "x", "reason": "r"}]',
     "entry 2 (commit 1234567): 'commit' '1234567' is not the hash of a commit on main"),
    ('[{"commit": "SIDE7", "series": "x", "reason": "r"}]', "is not the hash of a commit on main"),
    ('[{"commit": "main", "series": "x", "reason": "r"}]', "'commit' 'main' is not the hash"),
])
def test_malformed_accepted_refuses_before_html(site, tmp_path, monkeypatch, capsys, text, message):
    repo, shas, side = site
    root = tmp_path / "root"
    shutil.copytree(repo, root, ignore=shutil.ignore_patterns("html", ".asv"))
    (root / "html").mkdir()
    (root / "html" / "index.html").write_text("as published before")
    good = json.dumps({"commit": shas[1][:7], "series": "x", "reason": "r"})
    (root / regressions.ACCEPTED).write_text(
        text.replace("GOOD", good).replace("MAIN7", shas[2][:7]).replace("SIDE7", side[:7]))
    monkeypatch.setattr(publish.subprocess, "call", lambda *a, **k: pytest.fail("asv publish ran"))
    assert publish.publish(root) == 1
    err = capsys.readouterr().err
    message = message.replace("MAIN7", shas[2][:7])
    assert err.count("\n") == 1 and err.startswith("python -m verify_attn publish: benchmarks/accepted.json") \
        and message in err, err
    assert [p.name for p in (root / "html").iterdir()] == ["index.html"]
    assert (root / "html" / "index.html").read_text() == "as published before"
    assert not (root / ".asv").exists()


@pytest.mark.parametrize("remote, url", [
    ("https://github.com/acme/verify-attn.git", "https://github.com/acme/verify-attn/commit/"),
    ("https://github.com/acme/verify-attn", "https://github.com/acme/verify-attn/commit/"),
    ("https://x-access-token:abc@github.com/acme/verify.attn.git", "https://github.com/acme/verify.attn/commit/"),
    ("git@github.com:acme/verify-attn.git", "https://github.com/acme/verify-attn/commit/"),
    ("ssh://git@github.com/acme/verify-attn.git", "https://github.com/acme/verify-attn/commit/"),
    ("https://gitlab.com/acme/verify-attn.git", None),
    (None, None),
])
def test_commit_url(tmp_path, monkeypatch, remote, url):
    for name in ("VERIFY_ATTN_COMMIT_URL", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY"):
        monkeypatch.delenv(name, raising=False)
    git(tmp_path, "init", "-q")
    if remote:
        git(tmp_path, "remote", "add", "origin", remote)
    assert regressions.commit_url(tmp_path) == url
    monkeypatch.setenv("VERIFY_ATTN_COMMIT_URL", "https://git.example.org/c/")  # the variable first
    assert regressions.commit_url(tmp_path) == "https://git.example.org/c/"
    monkeypatch.setenv("VERIFY_ATTN_COMMIT_URL", "")  # set and empty: no links
    assert regressions.commit_url(tmp_path) is None


def test_commit_url_of_a_github_actions_job(tmp_path, monkeypatch):
    """A workflow publishes from a checkout whose origin need not be GitHub's address (act: a
    local path): the job's own repository names the commit pages; a malformed one names none."""
    monkeypatch.delenv("VERIFY_ATTN_COMMIT_URL", raising=False)
    git(tmp_path, "init", "-q")
    git(tmp_path, "remote", "add", "origin", "/srv/mirror/verify-attn.git")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/verify-attn")
    assert regressions.commit_url(tmp_path) == "https://github.com/acme/verify-attn/commit/"
    monkeypatch.setenv("GITHUB_REPOSITORY", 'acme/x"><script>')
    assert regressions.commit_url(tmp_path) is None


def test_a_step_accepted_at_an_unrecorded_commit_shows_at_the_first_recorded_one():
    """regressions.first_of: 2c6b22e made the ragged plan but has no results; 8ecc171 is the
    first recorded commit after it, where the graphs draw a step accepted at 2c6b22e. A
    recorded commit is its own; one off the branches, or with nothing recorded after it, none."""
    from verify_attn_tools import landing, regressions

    recorded = {sha for sha, _ in landing.results_files(ROOT / "results", "nvidia-h200")}
    first = regressions.first_of(ROOT, "2c6b22e", ["main"], recorded)
    assert first is not None and first.startswith("8ecc171")
    assert regressions.first_of(ROOT, first[:10], ["main"], recorded) == first
    assert regressions.first_of(ROOT, "2c6b22e", ["main"], set()) is None
    assert regressions.first_of(ROOT, "0" * 40, ["main"], recorded) is None
