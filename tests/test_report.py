"""The report verb: verdict, rows, exit codes and machine choice, from asv results written
through asv's own API (two real commits of this repository, synthetic samples)."""

import json
import random
import re
import subprocess

import pytest

from verify_attn_tools import history, report

PARAMS = [["64"], ["9"], ["2048", "65536"], ["'naive'", "'flash'", "'tc'"]]
CASE_PARAMS = [["'ragged_3x16x9'", "'seed_2x8x9x9'"], ["'naive'", "'flash'", "'tc'"]]
COMBOS = [(p, i) for p in (2048, 65536) for i in ("naive", "flash", "tc")]


def commits():
    """The newest two commits of HEAD's line with measured code of their own: report compares
    those (two commits with the same measured code are "same measured code", nothing to judge)."""
    after = history.measured_code(report.ROOT, report.git_hash("HEAD"))
    return history.measured_code(report.ROOT, report.git_hash(f"{after}~1")), after


def write(results, machine, commit, times: dict, failed=(), failed_cases=(), anchor=None, anchor_version="0a1b2c3"):
    """Quick.track_time (15 samples around each median), the drift-free series
    track_time_vs_anchor (15 samples around anchor's ratio at each point, by default the time
    over BASE's; not recorded when anchor_version is None: an older commit), the two ratio
    series and the named cases' errors (QuickCases) of one commit."""
    from asv import results as asv_results, runner

    (results / machine).mkdir(parents=True, exist_ok=True)
    (results / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    res = asv_results.Results({"machine": machine}, {}, commit, 1, "3.12", "reuse-py3.12", {})
    rng = random.Random(commit)
    values, samples, vs_anchor, anchor_samples, vs_naive, vs_roof = [], [], [], [], [], []
    for combo in COMBOS:
        if combo in failed:
            for series in (values, samples, vs_anchor, anchor_samples, vs_naive, vs_roof):
                series.append(None)
            continue
        t, x = times[combo], anchor[combo] if anchor else times[combo] / BASE[combo]
        values.append(t), samples.append([t * (1 + rng.uniform(-0.002, 0.002)) for _ in range(15)])
        vs_anchor.append(x), anchor_samples.append([x * (1 + rng.uniform(-0.002, 0.002)) for _ in range(15)])
        vs_naive.append(t / times[(combo[0], "naive")]), vs_roof.append(t / 1e-4)
    series = [("track_time", values, samples, "1"), ("track_time_vs_naive", vs_naive, None, "1"),
              ("track_time_vs_roofline", vs_roof, None, "1")]
    if anchor_version is not None:
        series.append(("track_time_vs_anchor", vs_anchor, anchor_samples, anchor_version))
    for name, vals, smp, version in series:
        res.add_result({"name": f"bench_verify_attn.Quick.{name}", "params": PARAMS, "version": version},
                       runner.BenchmarkResult(vals, smp or [None] * len(vals), [1 if smp else None] * len(vals), 0, "", None),
                       record_samples=smp is not None)
    errors = [None if (c, i) in failed_cases else 0.003 for c in ("ragged_3x16x9", "seed_2x8x9x9")
              for i in ("naive", "flash", "tc")]
    res.add_result({"name": "bench_verify_attn.QuickCases.track_error", "params": CASE_PARAMS, "version": "1"},
                   runner.BenchmarkResult(errors, [None] * 6, [None] * 6, 0, "", None))
    res.save(str(results))


BASE = {(2048, "naive"): 4e-3, (2048, "flash"): 2e-4, (2048, "tc"): 3e-5,
        (65536, "naive"): 0.13, (65536, "flash"): 6e-3, (65536, "tc"): 3.3e-4}


@pytest.fixture
def results(tmp_path):
    a, b = commits()
    write(tmp_path, "nvidia-h200", a, BASE)
    return tmp_path, a, b


def run(results, *args):
    return report.main([*args, "--results", str(results)])


def test_no_change_exits_0_and_folds_every_row(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert "**no significant change**" in out.splitlines()[0]
    assert "<details><summary>6 counted points judged, unchanged</summary>" in out
    assert re.search(r"\| \d\.\d% / \d\.\d% \| x anchor ", out), "the spread column: IQR / median, before / after"
    assert len(out.splitlines()) <= 60


def test_a_slowdown_exits_1_and_comes_first(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, {**BASE, (65536, "tc"): 3.3e-4 * 1.05, (2048, "flash"): 2e-4 * 0.9})
    assert run(path, a, b, "--only-changed") == 1
    lines = capsys.readouterr().out.splitlines()
    assert "**slower**" in lines[0] and re.search(r"1 slower, worst tc at Quick h64 q9 p65536 [45]\.\d% slower", lines[2])
    assert re.search(r"1 faster, best flash at Quick h64 q9 p2048 1[01]\.\d% faster|1\.1\dx faster", lines[2])
    table = [l for l in lines if l.startswith("| Quick")]
    assert table[0].startswith("| Quick h64 q9 p65536 | tc |") and "differ (Mann-Whitney" in table[0]
    assert table[0].endswith("| **slower** |") and re.search(r"\| [45]\.\d% slower \|", table[0])
    assert "faster" in table[1] and len(table) == 2  # unchanged rows dropped


def test_a_slowdown_inside_the_factor_does_not_count(results):
    path, a, b = results
    write(path, "nvidia-h200", b, {**BASE, (65536, "tc"): 3.3e-4 * 1.02})
    assert run(path, a, b) == 0


def test_a_failure_exits_2_and_is_first(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, {**BASE, (2048, "tc"): 1e-5}, failed=[(65536, "flash")])
    assert run(path, a, b) == 2
    lines = capsys.readouterr().out.splitlines()
    assert "**failed**" in lines[0]
    first = next(l for l in lines if l.startswith("| Quick"))
    assert "| flash |" in first and "**FAILED**" in first


def test_a_failure_in_both_is_shown_but_not_the_verdict(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", a, BASE, failed=[(65536, "flash")])
    write(path, "nvidia-h200", b, BASE, failed=[(65536, "flash")])
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert "1 still failing" in out.splitlines()[2] and "| flash | failed | failed |" in out


def test_a_failing_named_case_exits_2_and_is_named(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE, failed=COMBOS, failed_cases=[("ragged_3x16x9", "flash")])
    assert run(path, a, b, "-b", "Quick") == 2
    lines = capsys.readouterr().out.splitlines()
    assert "**failed**" in lines[0] and "1 named case failed" in lines[2]
    assert any(l.startswith("Named cases failing") and "flash on ragged_3x16x9." in l for l in lines)
    assert run(path, a, b, "-b", "Quick", "--json") == 2
    assert json.loads(capsys.readouterr().out)["failed_cases"] == ["flash on ragged_3x16x9"]


def test_json_and_the_machine_that_has_both(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    write(path, "cpu-x86_64", a, BASE)  # another machine, with one of the two commits only
    assert run(path, a, b, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["machine"] == "nvidia-h200" and data["exit"] == 0 and len(data["rows"]) == 6 and data["rule"] == "asv"
    row = next(r for r in data["rows"] if r["impl"] == "tc" and "p65536" in r["case"])
    assert row["speedup"][0] == pytest.approx(0.13 / 3.3e-4, rel=1e-6)


def test_a_raw_drift_with_a_flat_anchor_series_exits_0(results, capsys):
    """Every raw time 5% up (another machine start), the ratios to the anchor flat: no change."""
    path, a, b = results
    write(path, "nvidia-h200", b, {c: t * 1.05 for c, t in BASE.items()}, anchor=dict.fromkeys(COMBOS, 1.0))
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert "**no significant change**" in out and "<details><summary>6 counted points judged, unchanged</summary>" in out
    assert re.search(r"\| Quick h64 q9 p65536 \| tc \| 0\.3(?:29|3)\d* ms \| 0\.34[5-7]\d* ms \|", out)  # raw times beside


def test_an_anchor_series_slowdown_exits_1_whatever_the_raw_times(results, capsys):
    """tc 5% up against the anchor while every raw time reads 5% down (a faster start): slower."""
    path, a, b = results
    write(path, "nvidia-h200", b, {c: t * 0.95 for c, t in BASE.items()},
          anchor={**dict.fromkeys(COMBOS, 1.0), (65536, "tc"): 1.05})
    assert run(path, a, b, "--only-changed") == 1
    lines = capsys.readouterr().out.splitlines()
    assert "**slower**" in lines[0] and "1 slower" in lines[2] and "faster" not in lines[2]
    table = [l for l in lines if l.startswith("| Quick")]
    assert len(table) == 1 and re.match(r"\| Quick h64 q9 p65536 \| tc \| 0\.3(?:29|3)\d* ms \| 0\.31[2-4]\d* ms \|", table[0])
    assert re.search(r"\| [45]\.\d% slower \|", table[0]) and "differ (Mann-Whitney p < 0.002)" in table[0]


@pytest.mark.parametrize("versions", [(None, None), (None, "0a1b2c3"), ("0a1b2c3", "4d5e6f7")],
                         ids=["neither", "after-only", "other-anchor"])
def test_raw_only_rows_are_not_judged(results, capsys, versions):
    """No drift-free series against the same anchor in both: a 6% raw move is shown, not judged."""
    path, a, b = results
    write(path, "nvidia-h200", a, BASE, anchor_version=versions[0])
    write(path, "nvidia-h200", b, {**BASE, (65536, "tc"): 3.3e-4 * 1.06}, anchor_version=versions[1])
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert "**not judged: no drift-free series for both commits**" in out.splitlines()[0]
    assert "Raw only (not judged):" in out and "drift by several %" in out
    rows = [l for l in out.splitlines() if l.startswith("| Quick")]
    assert len(rows) == 6 and all("| raw times only |" in l and l.endswith("| raw only (not judged) |") for l in rows)
    # 6% apart, each median from 15 samples within +-0.2% (seeded by the commit's hash): 5.6-6.4%
    assert rows[0].startswith("| Quick h64 q9 p65536 | tc |") and re.search(r"\| (5\.[6-9]|6\.[0-4])% slower \(raw\) \|", rows[0])
    assert run(path, a, b, "--json") == 0
    assert {r["change"] for r in json.loads(capsys.readouterr().out)["rows"]} == {"raw"}


def test_a_commit_without_results_exits_3(results, capsys):
    path, a, b = results
    assert run(path, a, b) == 3
    assert run(path, a, b, "--machine", "nvidia-h200") == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(f"no results of {b[:8]}" in l for l in err)


def test_no_machine_with_both_is_a_refusal(results, capsys):
    path, a, b = results
    write(path, "cpu-x86_64", b, BASE)
    assert run(path, a, b) == 2
    assert "no machine" in capsys.readouterr().err


def test_a_malformed_results_file_exits_4_in_one_line(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    bad = next((path / "nvidia-h200").glob(f"{b[:8]}-*.json"))
    bad.write_text('{"results": ')
    assert run(path, a, b) == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"malformed results file {bad}: field (the file): not readable JSON" in err[0]


def test_unknown_commit_is_one_line(results, capsys):
    path, a, _ = results
    assert run(path, a, "no-such-commit") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "not a commit" in err[0]


def test_a_peer_slowdown_is_shown_but_not_the_verdict(results, capsys, monkeypatch):
    import dataclasses

    from verify_attn import registry

    path, a, b = results
    monkeypatch.setitem(registry.IMPLS, "flash", dataclasses.replace(registry.IMPLS["flash"], under_test=False))
    write(path, "nvidia-h200", b, {**BASE, (65536, "flash"): 6e-3 * 1.10})
    assert run(path, a, b, "--only-changed") == 0
    out = capsys.readouterr().out
    assert "**no significant change**" in out
    assert "| Quick h64 q9 p65536 | flash |" in out and "(a peer: not counted)" in out


def test_an_older_layout_is_labelled_by_its_own_parameters():
    """Quick gained its heads axis: older results (q_len, prefix, impl) keep readable labels."""
    names = report.param_names("bench_verify_attn.Quick.track_time",
                               {"bench_verify_attn.Quick.track_time":
                                {"param_names": ["heads", "q_len", "prefix_len", "impl"]}}, 3)
    assert report.label("Quick", names, ("9", "65536", "tc")) == ("Quick q9 p65536", "tc")


# --- one comment, one verdict, one rule ----------------------------------------------------


@pytest.mark.parametrize("ratio, words", [(0.758, "1.32x faster"), (1.018, "1.8% slower"), (0.95, "5.3% faster"),
                                          (2.0, "2.00x slower"), (1.0002, "same"), (None, "-")])
def test_change_words(ratio, words):
    assert report.change_words(ratio) == words


def ab_file(tmp_path, rows, exit=0, failed=(), name="ab.json", points="quick"):
    """What `python -m verify_attn ab BASE --json FILE` writes (its fields as ab.Row has them)."""
    full = [{"point": point, "impl": impl, "status": status, "base_s": 1e-4, "head_s": 1e-4 * ratio, "ratio": ratio,
             "slower": 18 if ratio > 1 else 2, "pairs": 20, "p": 0.0004, "reason": "", "iqr": [ratio - 0.002, ratio + 0.002],
             "clock_mhz": 1980.0} for point, impl, status, ratio in rows]
    path = tmp_path / name
    path.write_text(json.dumps({"base": "x", "head": "y", "device": "cuda", "gpu": "NVIDIA H200", "factor": 1.01,
                                "alpha": 0.01, "exit": exit, "failed": list(failed), "rows": full, "points": points}))
    return path


AB_SAME = [(f"h64 q9 p{p}", i, "same", 1.001) for p in (2048, 65536) for i in ("naive", "flash", "tc")]


def test_where_ab_ran_its_verdict_is_the_comments(results, capsys):
    """asv's drift-free series reads tc 5% slower, the paired check reads it the same: ab's rule
    decides (exit 0), asv's rows are folded, shown, not deciding."""
    path, a, b = results
    write(path, "nvidia-h200", b, BASE, anchor={**dict.fromkeys(COMBOS, 1.0), (65536, "tc"): 1.05})
    assert run(path, a, b, "--ab", str(ab_file(path, AB_SAME))) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "**no significant change**" in lines[0] and "(6 counted points)" in lines[2]
    assert "`kernels/` changed, so the paired check decides" in out and "sign test" in out
    assert out.count("**no significant change**") == 1 and "verify-attn ab" not in out, "one verdict, one format"
    assert "<details><summary>6 counted points unchanged (the paired check)</summary>" in out
    assert "<details><summary>6 counted points, asv's recorded results (shown, not deciding here)</summary>" in out
    assert "paired check 1980 MHz" in out and "the paired check ran on NVIDIA H200" in out


def test_an_ab_slowdown_is_the_verdict_with_its_rows_first(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    rows = [r if r[:2] != ("h64 q9 p65536", "tc") else ("h64 q9 p65536", "tc", "slower", 1.018) for r in AB_SAME]
    assert run(path, a, b, "--ab", str(ab_file(path, rows, exit=1))) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "**slower**" in lines[0] and "1 slower, worst tc at Quick h64 q9 p65536 1.8% slower" in lines[2]
    first = next(l for l in lines if l.startswith("| Quick"))
    assert first.startswith("| Quick h64 q9 p65536 | tc | 0.1 ms | 0.1018 ms | 1.8% slower | 0.4% | 18/20 pairs slower")
    assert first.endswith("| **slower** |") and re.search(r"\| \d+x \| [\d.]+% \| \*\*slower", first)  # asv's x naive, % of peak
    assert out.index(first) < out.index("<details>")


def test_ab_at_another_selection_names_its_class(results, capsys):
    """ab --points serving_chain: its rows and the verdict name ServingChain's points, not Quick's."""
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    rows = [("b8 h16 q9", "tc", "slower", 1.05), ("b32 h64 q9", "tc", "same", 1.001)]
    assert run(path, a, b, "--ab", str(ab_file(path, rows, exit=1, points="serving_chain"))) == 1
    out = capsys.readouterr().out
    assert "worst tc at ServingChain b8 h16 q9 5.0% slower" in out.splitlines()[2]
    assert "| ServingChain b8 h16 q9 | tc |" in out and "| ServingChain b32 h64 q9 | tc |" in out
    assert "Quick b8" not in out and report.ab_params("b8 h16 q9", "tc") == {"batch": "8", "heads": "16", "q_len": "9",
                                                                             "impl": "'tc'"}


def test_ab_over_several_selections_names_each_rows_class(results, capsys):
    """ab --points quick chain serving_chain: one file, each row carries its selection, and the
    comment names each row's class (a row without one falls back to Quick)."""
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    rows = [("b8 h16 q9", "tc", "slower", 1.05), ("h8 q9 p2048", "tc", "faster", 0.9), ("h64 q9 p2048", "tc", "same", 1.001)]
    f = ab_file(path, rows, exit=1, points=["serving_chain", "chain", "quick"])
    data = json.loads(f.read_text())
    for row, sel in zip(data["rows"], ("serving_chain", "chain", "quick")):
        row["selection"] = sel
    f.write_text(json.dumps(data))
    assert run(path, a, b, "--ab", str(f)) == 1
    out = capsys.readouterr().out
    assert "worst tc at ServingChain b8 h16 q9 5.0% slower" in out.splitlines()[2]
    assert "| ServingChain b8 h16 q9 | tc |" in out and "| Chain h8 q9 p2048 | tc |" in out
    assert "| Quick h64 q9 p2048 | tc |" in out and "Quick b8" not in out and "Quick h8" not in out


def test_an_ab_refusal_or_failure_fails_the_comment(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    assert run(path, a, b, "--ab", str(ab_file(path, [], exit=2, failed=["tc on ragged_3x16x9"]))) == 2
    out = capsys.readouterr().out
    assert "**failed**" in out.splitlines()[0] and "tc on ragged_3x16x9" in out
    (path / "bad.json").write_text('{"rows": 1}')
    assert run(path, a, b, "--ab", str(path / "bad.json")) == 2
    assert "not the JSON of `python -m verify_attn ab --json`" in capsys.readouterr().err


def test_counted_rows_come_before_the_peers(results, capsys, monkeypatch):
    """A peer that moved most still comes after every counted row, folded below them."""
    import dataclasses

    from verify_attn import registry

    path, a, b = results
    monkeypatch.setitem(registry.IMPLS, "naive", dataclasses.replace(registry.IMPLS["naive"], under_test=False))
    write(path, "nvidia-h200", b, BASE, anchor={**dict.fromkeys(COMBOS, 1.0), (65536, "naive"): 1.5,
                                                (2048, "tc"): 1.05})
    assert run(path, a, b) == 1
    out = capsys.readouterr().out
    table = [l for l in out.splitlines() if l.startswith("| Quick")]
    assert table[0].startswith("| Quick h64 q9 p2048 | tc |")
    peers = out.index("peers (naive): shown, never counted")
    assert all(out.index(l) > peers for l in table if "| naive |" in l)
    assert all(out.index(l) < peers for l in table if "| naive |" not in l)


def test_links_and_the_gpu_line(results, capsys, monkeypatch):
    """Commit links and the asv graph of a moved point (bare URLs: they survive the sanitizer)."""
    from verify_attn_tools.sanitize import sanitize

    path, a, b = results
    write(path, "nvidia-h200", b, BASE, anchor={**dict.fromkeys(COMBOS, 1.0), (65536, "tc"): 1.05})
    monkeypatch.setenv("VERIFY_ATTN_COMMIT_URL", "https://github.com/o/r/commit/")
    monkeypatch.setenv("VERIFY_ATTN_SITE_URL", "https://o.github.io/r/")
    assert run(path, a, b) == 1
    out = capsys.readouterr().out
    assert f"before {a[:8]} https://github.com/o/r/commit/{a}, after {b[:8]} https://github.com/o/r/commit/{b}" in out
    graph = ("https://o.github.io/r/#bench_verify_attn.Quick.track_time_vs_anchor?machine=nvidia-h200&p-heads=64"
             "&p-q_len=9&p-prefix_len=65536&p-impl=%27tc%27")
    assert f"tc at Quick h64 q9 p65536: {graph}" in out
    assert graph in sanitize(out) and f"https://github.com/o/r/commit/{a}" in sanitize(out)
    assert "**GPU:** nvidia-h200" in out and "SM clock not recorded" in out
    monkeypatch.setenv("VERIFY_ATTN_COMMIT_URL", "")
    monkeypatch.setenv("VERIFY_ATTN_SITE_URL", "")
    assert run(path, a, b) == 1
    assert "https://" not in capsys.readouterr().out


def test_names_from_result_files_and_ab_rows_are_escaped(results, capsys):
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    rows = [("h64 q9 p65536", "@team <img src=x> [l](http://e)", "slower", 1.5)]
    assert run(path, a, b, "--ab", str(ab_file(path, rows, exit=1))) == 1
    out = capsys.readouterr().out
    assert "<img" not in out and "[l]" not in out and "@team" not in out
    assert "@\u200dteam &lt;img src=x&gt; &#91;l&#93;(http://e)" in out


def test_a_series_accepted_json_does_not_judge_is_shown_not_deciding(results, capsys, monkeypatch, tmp_path):
    """An entry of benchmarks/accepted.json with commit null (ColdL2's pairs, the peers') takes
    its series off the verdict, as off the regressions page."""
    path, a, b = results
    slower = {**dict.fromkeys(COMBOS, 1.0), (65536, "tc"): 1.5}
    write(path, "nvidia-h200", b, BASE, anchor=slower)
    assert run(path, a, b) == 1
    root = tmp_path / "root"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "accepted.json").write_text(json.dumps([{
        "commit": None, "series": r"bench_verify_attn\.Quick\.track_time_vs_anchor\(.*65536, 'tc'\)",
        "reason": "not judged here"}]))
    unjudged = report.not_judged
    monkeypatch.setattr(report, "not_judged", lambda: unjudged(root))
    capsys.readouterr()
    assert run(path, a, b) == 0
    assert "raw only" in capsys.readouterr().out


def test_a_malformed_accepted_json_is_a_refusal_naming_the_entry(tmp_path):
    """report reads benchmarks/accepted.json through the regressions page's own loader: the same
    checks, the same message (entry and field), as a refusal rather than a traceback."""
    (tmp_path / "benchmarks").mkdir()
    path = tmp_path / "benchmarks" / "accepted.json"
    path.write_text(json.dumps([{"commit": None, "series": "a", "reason": "r"}, {"commit": None, "reason": "r"}]))
    with pytest.raises(report.Refusal, match=r"entry 2: 'series' is missing"):
        report.not_judged(tmp_path)
    path.write_text(json.dumps([{"commit": None, "series": "(", "reason": "r"}]))
    with pytest.raises(report.Refusal, match=r"entry 1: 'series' is not a regular expression"):
        report.not_judged(tmp_path)
    path.write_text(json.dumps([{"commit": None, "series": "x\\.y", "reason": "r"},
                                {"commit": "abc1234", "series": "z", "reason": "r"}]))
    assert [p.pattern for p in report.not_judged(tmp_path)] == ["x\\.y"]


def test_a_step_accepted_at_a_commit_in_the_range_is_marked_not_deciding(results, capsys, monkeypatch):
    """A slower series that benchmarks/accepted.json accepts at a commit after the base, up to
    the head (regressions.accepted_between), is shown and marked, and the verdict is the rest's:
    as the regressions page drops the accepted step, report does not exit 1 on it."""
    from verify_attn_tools import regressions

    path, a, b = results
    write(path, "nvidia-h200", b, {**BASE, (65536, "tc"): 3.3e-4 * 1.05})
    seen = []

    def between(root, before, after):
        seen.append((before, after))
        return [(b[:7], re.compile(r"bench_verify_attn\.Quick\.track_time(_vs_anchor)?\(64, 9, 65536, 'tc'\)"))]

    monkeypatch.setattr(regressions, "accepted_between", between)
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert seen == [(a, b)]
    assert "**accepted steps only**" in out.splitlines()[0]
    assert re.search(rf"1 slower as accepted in benchmarks/accepted.json at {b[:7]}, worst tc at Quick h64 q9 p65536", out)
    row = next(l for l in out.splitlines() if l.startswith("| Quick h64 q9 p65536 | tc |"))
    assert row.endswith(f"**slower** (accepted at {b[:7]}: benchmarks/accepted.json) |")
    monkeypatch.setattr(regressions, "accepted_between", lambda root, before, after: [])
    assert run(path, a, b) == 1


def test_accepted_between_takes_the_steps_after_the_base_up_to_the_head(tmp_path):
    """Which entries of benchmarks/accepted.json apply to a comparison: a named commit the head
    contains and the base does not; commit null (never judged) and unknown commits never."""
    from verify_attn_tools import regressions

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    shas = []
    for n in range(3):
        (tmp_path / "f").write_text(str(n))
        git("add", "f")
        git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", f"c{n}")
        shas.append(git("rev-parse", "HEAD"))
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "accepted.json").write_text(json.dumps([
        {"commit": shas[1][:7], "series": "s1", "reason": "r"}, {"commit": None, "series": "s0", "reason": "r"},
        {"commit": "0123abc", "series": "s2", "reason": "r"}]))

    def between(before, after):
        return [(c, p.pattern) for c, p in regressions.accepted_between(tmp_path, before, after)]

    assert between(shas[0], shas[2]) == [(shas[1][:7], "s1")]
    assert between(shas[0], shas[1]) == [(shas[1][:7], "s1")]
    assert between(shas[1], shas[2]) == []
    assert between(shas[2], shas[2]) == []


@pytest.mark.parametrize("bench", ["quick", "NoSuchClass", "("])
def test_a_bench_regex_that_matches_nothing_is_refused(results, capsys, bench):
    """-b quick (for Quick) selects nothing: exit 2 in one line, not "nothing to judge" and 0."""
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    assert run(path, a, b, "-b", bench) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert not captured.out and len(err) == 1
    assert f"no benchmark matches {bench!r}" in err[0] if bench != "(" else "'(' is not a regex" in err[0]
    assert run(path, a, b, "-b", "Quick") == 0


def commit(repo, files: dict, message: str) -> str:
    from conftest import git

    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return report.git_hash("HEAD")


@pytest.fixture
def line(tmp_path, monkeypatch):
    """A first-parent line in a repository of its own: kernels v1, docs, kernels v2, docs; the
    results of the two kernel commits under results/."""
    from conftest import git

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    monkeypatch.setattr(report, "ROOT", repo)
    shas = {"k1": commit(repo, {"kernels/k.cu": "v1"}, "kernels"),
            "d1": commit(repo, {"README.md": "docs"}, "docs"),
            "k2": commit(repo, {"kernels/k.cu": "v2"}, "kernels again"),
            "d2": commit(repo, {"README.md": "more docs", "verify_attn_tools/x.py": "tooling"}, "docs and tooling")}
    results = tmp_path / "results"
    for name in ("k1", "k2"):
        write(results, "nvidia-h200", shas[name], BASE)
    return results, shas


def test_a_commit_without_measured_changes_uses_its_ancestors_results(line, capsys):
    """HEAD changed only docs and tooling: it measures k2's code, so k2's results stand for it,
    and the comment says so in one line."""
    results, shas = line
    assert run(results, shas["d1"], "HEAD") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"### verify-attn {shas['d1'][:8]} → {shas['d2'][:8]} on nvidia-h200: **no significant")
    notes = [l for l in out.splitlines() if "whose results are used" in l]
    assert notes == [f"{shas['d1'][:8]} measures the code of {shas['k1'][:8]}, whose results are used.",
                     f"HEAD ({shas['d2'][:8]}) measures the code of {shas['k2'][:8]}, whose results are used."]
    assert run(results, shas["k1"], "HEAD", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["after"] == shas["d2"] and data["results_of"] == {"before": shas["k1"], "after": shas["k2"]}
    # results of its own come first
    write(results, "nvidia-h200", shas["d2"], BASE)
    assert run(results, shas["k1"], "HEAD") == 0
    assert "whose results are used" not in capsys.readouterr().out


def test_the_same_measured_code_on_both_sides_exits_0(line, capsys):
    results, shas = line
    for before, after in (("main", "HEAD"), (shas["k2"], "HEAD"), (shas["k1"], shas["d1"])):
        assert run(results, before, after) == 0
        out = capsys.readouterr().out
        assert "**same measured code**" in out.splitlines()[0] and out.count("\n") == 3, out
    assert run(results, "main", "HEAD") == 0
    assert f"main and HEAD ({shas['d2'][:8]}) on both sides: one commit, the measured code of {shas['k2'][:8]}" in \
        capsys.readouterr().out


def test_an_ancestor_without_results_is_named_once(line, capsys):
    """HEAD stands for k2: with k2's results gone it is k2 that lacks them (exit 3), named once."""
    results, shas = line
    for path in (results / "nvidia-h200").glob(f"{shas['k2'][:8]}-*.json"):
        path.unlink()
    assert run(results, shas["k1"], "HEAD") == 3
    assert run(results, shas["d1"], "HEAD", "--machine", "nvidia-h200") == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(f"no results of {shas['k2'][:8]} (the measured code of HEAD ({shas['d2'][:8]}))"
                                 in l for l in err)
    assert shas["k1"][:8] not in err[0] and err[0].count(shas["k2"][:8]) == 1


def test_the_header_and_the_folds_say_judged_and_raw_only_alike(results, capsys):
    """The counted points: how many judged (x anchor), how many raw only, in the same words as
    the folds and the status column."""
    path, a, b = results
    write(path, "nvidia-h200", b, BASE)
    assert run(path, a, b) == 0
    assert "within the rule (6 counted points, all judged)." in capsys.readouterr().out
    write(path, "nvidia-h200", b, BASE, anchor_version="4d5e6f7")
    assert run(path, a, b) == 0
    out = capsys.readouterr().out
    assert "6 raw only, not judged (6 counted points, none judged)." in out
    assert "<details><summary>6 counted points raw only, not judged</summary>" in out
