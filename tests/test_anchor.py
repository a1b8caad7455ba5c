"""The drift-free series: the anchor's build beside the checkout's, each implementation timed
in turn with its yardstick there; the timer's sample counts; the spread verb."""

import gzip
import itertools
import json
import re
import time

import pytest

from verify_attn import anchor, candidate, cases
from verify_attn.measure import measure_case, paired_ratios
from verify_attn.timer import Timer


def test_each_kernel_is_paired_with_its_own_anchor_twin_on_the_cpu(monkeypatch):
    monkeypatch.setenv(anchor.ENV, "HEAD")
    monkeypatch.setattr(anchor, "_state", {})
    ns, note = anchor.load()
    assert ns == anchor.NS, note
    case = cases.grid_case(8, 9, 2048)
    computed = []
    reference_of = candidate.reference_of
    monkeypatch.setattr(candidate, "reference_of", lambda inputs: computed.append(1) or reference_of(inputs))
    timer = Timer("cpu", samples=6, warmup_s=0.0)
    orders = []
    time_many = timer.time_many
    monkeypatch.setattr(timer, "time_many", lambda variants, **kw: orders.append((list(variants), kw)) or
                        time_many(variants, **kw))
    got = measure_case(case, ["naive", "flash", "torch", "tc"], timer, anchor_ns=ns)
    assert len(computed) == 1  # one float64 reference for the point, its yardsticks' checks included
    # each kernel beside its twin, every other round reversed
    assert orders == [(["naive", f"naive@{ns}", "flash", f"flash@{ns}", "torch"],
                       {"reverse_odd_rounds": True, "ties": {"naive": f"naive@{ns}", "flash": f"flash@{ns}"}})]
    for impl in ("naive", "flash"):
        r = got[impl]
        # one drift-free value per two rounds (measure.paired_ratios)
        assert r.anchor_of == f"{impl}@{anchor.NS}" and len(r.timing.samples) == 6 and len(r.anchor) == 3
        assert 0.5 < sorted(r.anchor)[1] < 2  # the same kernel on both sides (HEAD's kernels/)
    assert got["torch"].anchor is None  # its yardstick, the anchor's tc, has no CPU backend
    assert got["tc"].skipped and got["tc"].anchor is None


def test_two_rounds_in_opposite_orders_make_one_drift_free_value():
    # The kernel first in round 0, its twin first in round 1 (reverse_odd_rounds), the second
    # of two samples 2% slower: single ratios alternate 0.98 / 1.02, each pair's value is 1.
    kernel, twin = [1.00, 1.02, 1.00, 1.02], [1.02, 1.00, 1.02, 1.00]
    assert [round(x, 12) for x in paired_ratios(kernel, twin)] == [1.0, 1.0]
    # an odd count (7 samples of a call over 20 ms) keeps a ratio a round
    assert paired_ratios([1.0, 2.0, 3.0], [1.0, 1.0, 2.0]) == [1.0, 2.0, 1.5]


def test_without_an_anchor_the_series_is_absent_and_says_why(monkeypatch):
    monkeypatch.setattr(anchor, "_state", {})
    monkeypatch.setenv(anchor.ENV, "off")
    assert anchor.load() == (None, f"{anchor.ENV}=off")
    monkeypatch.setattr(anchor, "_state", {})
    monkeypatch.setenv(anchor.ENV, "no-such-revision")
    ns, note = anchor.load()
    assert ns is None and "no-such-revision" in note


def test_a_peer_is_divided_by_the_anchors_tc():
    class Ops:  # an anchor build's namespace holding flash and tc
        flash = tc = object()

    import torch

    torch.ops.va_test_anchor = Ops  # getattr(torch.ops, ns) is how the yardstick is looked up
    try:
        assert anchor.yardstick("flash", "va_test_anchor") == "flash"
        assert anchor.yardstick("torch", "va_test_anchor") == "tc"
        assert anchor.yardstick("naive", "va_test_anchor") == "tc"  # not in that build
        assert anchor.yardstick("flash", None) is None
    finally:
        del torch.ops.va_test_anchor


def test_a_slow_call_gets_fewer_samples():
    timer = Timer("cpu", samples=6, min_sample_s=0.0, warmup_s=0.0, slow_call_s=0.01, slow_samples=3)
    got = timer.time_many({"slow": [lambda: time.sleep(0.02)], "fast": [lambda: None]})
    assert len(got["slow"].samples) == 3 and len(got["fast"].samples) == 6


def twin(run, tmp_path, name="twin.json"):
    """Another start of run's commit that read every point the same: its file with another date."""
    d = json.loads(run.read_text())
    d["date"] += 1
    (tmp_path / name).write_text(json.dumps(d))
    return tmp_path / name


def test_spread_of_one_commits_runs(tmp_path, capsys):
    """Two runs with the same values spread by nothing; files of two commits are refused (exit 2)."""
    from conftest import ROOT
    from verify_attn_tools import spread

    run = ROOT / "results" / "nvidia-h200" / "cbb6b5e6-reuse-py3.12.json"
    other = twin(run, tmp_path)
    out = tmp_path / "spread.json"
    assert spread.main([str(run), str(other), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows and all(r["track_time"] == 0 == r["track_time_vs_anchor"] and r["ms"] >= 0.02 for r in rows)
    assert {"Quick", "Serving"} <= {r["class"] for r in rows}
    out_text = capsys.readouterr().out
    assert "largest spread raw 0.00%" in out_text
    assert "judged Quick points: met" in out_text and "or more: met" in out_text
    assert spread.main([str(run), str(ROOT / "results" / "nvidia-h200" / "8cc6a600-reuse-py3.12.json")]) == 2
    assert "different commits" in capsys.readouterr().err
    # an extra start kept gzipped (results/<machine>/starts/) reads as the file itself
    packed = tmp_path / "cbb6b5e6-start.json.gz"
    packed.write_bytes(gzip.compress(other.read_bytes()))
    assert spread.main([str(run), str(packed), "--json", str(out)]) == 0 and json.loads(out.read_text()) == rows
    packed.write_bytes(b"not gzip")
    assert spread.main([str(run), str(packed)]) == 2
    assert "not an asv result file" in capsys.readouterr().err


def test_spread_keeps_points_that_some_runs_lack(tmp_path, capsys):
    """A start run with -b holds only some classes: their points spread over the runs that hold
    them and the summary says how many those are; a point that one run alone holds is left out."""
    from conftest import ROOT
    from verify_attn_tools import spread

    run = ROOT / "results" / "nvidia-h200" / "cbb6b5e6-reuse-py3.12.json"
    d = json.loads(run.read_text())
    d["results"] = {k: v for k, v in d["results"].items() if ".Serving." not in k}
    part, out = tmp_path / "part.json", tmp_path / "rows.json"
    part.write_text(json.dumps(d))
    assert spread.main([str(run), str(part), str(twin(run, tmp_path)), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["runs"] for r in rows if r["class"] == "Serving"} == {2}
    assert {r["runs"] for r in rows if r["class"] != "Serving"} == {3}
    text = capsys.readouterr().out
    serving = sum(r["class"] == "Serving" for r in rows)
    assert f"# Serving: {serving} points ({serving} of them in 2 of 3 runs)" in text
    assert re.search(r"or more \((\d+) of them in 2 of 3 runs\): met", text)
    assert spread.main([str(run), str(part), "--json", str(out)]) == 0
    assert "Serving" not in {r["class"] for r in json.loads(out.read_text())}


def test_spread_names_the_file_that_reads_a_point_off(tmp_path, capsys):
    """Per file, how far its drift-free values sit from the points' medians; a point beyond a
    goal names the files that read it highest and lowest. One file with Quick's tc at heads 64,
    q_len 9, prefix 2,048 set 3% higher than the recorded one is that point's high end and the
    only file with a point beyond 1%."""
    from conftest import ROOT
    from verify_attn_tools import spread

    run = ROOT / "results" / "nvidia-h200" / "8741e72b-reuse-py3.12.json"
    d = json.loads(run.read_text())
    key = "bench_verify_attn.Quick.track_time_vs_anchor"
    entry = d["results"][key]
    combos = list(itertools.product(*entry[1]))
    k = combos.index(("64", "9", "2048", "'tc'"))
    samples = d["result_columns"].index("samples")
    entry[0][k] *= 1.03
    entry[samples][k] = [v * 1.03 for v in entry[samples][k]]
    high = tmp_path / "high.json"
    high.write_text(json.dumps(d))
    assert spread.main([str(run), str(twin(run, tmp_path)), str(high)]) == 1
    text = capsys.readouterr().out
    assert "# goal, x anchor within 1% at each of the 24 judged Quick points: NOT met at Quick 64 9 2048 tc 3.00% " \
           "(x anchor 0.962; high high.json +3.00%, low 8741e72b-reuse-py3.12.json +0.00%)" in text
    assert re.search(r"# high.json: \d+ judged points, x anchor \+0\.0\d\d% from their medians on average, 1 beyond "
                     r"\+-1%, most \+3\.00% at Quick 64 9 2048 tc", text)
    assert re.search(r"# 8741e72b-reuse-py3.12.json: \d+ judged points, x anchor \+0\.000% .* 0 beyond", text)


def test_spread_refuses_one_run_given_twice_and_every_refusal_exits_2(tmp_path, capsys):
    """One run against itself spreads by nothing and would meet every goal: the same path, a copy,
    or its .json.gz is refused in one line naming both files; so is a missing file or one that is
    not asv's, exit 2 each (1 is a goal not met)."""
    from conftest import ROOT
    from verify_attn_tools import spread

    run = ROOT / "results" / "nvidia-h200" / "cbb6b5e6-reuse-py3.12.json"
    copy, packed = tmp_path / "copy.json", tmp_path / "packed.json.gz"
    copy.write_text(json.dumps(json.loads(run.read_text()), indent=2))
    packed.write_bytes(gzip.compress(run.read_bytes()))
    for files, words in (([run, run], f"{run} is given twice"),
                         ([run, copy], f"{run} and {copy} hold the same run"),
                         ([packed, twin(run, tmp_path), run], f"{packed} and {run} hold the same run"),
                         ([run, tmp_path / "nosuch.json"], "nosuch.json: no such file"),
                         ([run, ROOT / "results" / "nvidia-h200" / "machine.json"], "not an asv result file")):
        assert spread.main([str(f) for f in files]) == 2
        out, err = capsys.readouterr()
        assert not out and len(err.splitlines()) == 1 and words in err, err


def test_the_spread_goals_judge_what_report_judges():
    from verify_attn_tools import spread

    def row(cls, combo, x):
        return {"class": cls, "point": " ".join(map(str, combo)), "combo": combo, "track_time": x,
                "track_time_vs_anchor": x, "ms": 0.03}

    rows = [row("Quick", (64, 9, 2048, "tc"), 0.012), row("Quick", (64, 9, 2048, "flash"), 0.009),
            row("Chain", (64, 9, 2048, "torch"), 0.30),   # a peer: not judged
            row("ColdL2", (9, 2048, "tc"), 0.50),         # taken off for good by benchmarks/accepted.json
            row("Heads8", (9, 2048, "tc_mma"), 0.019)]
    (_, quick), (words, every) = spread.verdicts(rows, 0.02)
    assert [r["point"] for r in quick] == ["64 9 2048 tc"]
    assert [r["point"] for r in every] == [] and "3 judged points of 0.02 ms or more" in words
    rows += [row("Heads16", (9, 16384, "tc_mma"), 0.025), row("Chain", (8, 9, 2048, "tc_mma"), 0.001)]
    for r in rows:
        r["track_time"] = 2 * r["track_time_vs_anchor"]
    assert spread.by_kernel(rows) == [
        "# tc_mma: 3 grid points, x anchor largest 2.50%, median 1.90%, 2 over 1%, 1 over 2%; "
        "raw largest 5.00%, median 3.80%"]


def test_spread_sets_points_near_their_twin_apart_from_those_far_off():
    """A point's median x anchor says how far its kernel has moved from the anchor's: the line
    counts the judged points within 3% of their twin's time and the others, each group's largest
    spread and its misses by spread's own goals (Quick 1%, else 2%); a peer (divided by the
    anchor's tc) stays out."""
    from verify_attn_tools import spread

    def row(cls, combo, spread_, level):
        return {"class": cls, "point": " ".join(map(str, combo)), "combo": combo, "track_time": 0.01,
                "track_time_vs_anchor": spread_, "level": level, "ms": 0.03}

    rows = [row("Quick", (64, 9, 2048, "tc"), 0.012, 0.962), row("Quick", (16, 9, 65536, "tc"), 0.004, 1.001),
            row("Chain", (8, 9, 2048, "tc"), 0.006, 0.965), row("Chain", (8, 9, 2048, "flashmla"), 0.05, 0.5)]
    assert spread.twins(rows) == ("# twins: 1 within 3% of their twin's time, largest spread 0.40%, 0 beyond their "
                                  "goal; 2 farther off, largest spread 1.20%, 1 beyond their goal")
    assert spread.twins(rows[1:2]) == ("# twins: 1 within 3% of their twin's time, largest spread 0.40%, 0 beyond "
                                       "their goal; 0 farther off")
    # Quick's goal is 1%, every other point's 2%: 1.5% misses at Quick, not in Chain
    rows[2]["track_time_vs_anchor"] = 0.015
    assert "2 farther off, largest spread 1.50%, 1 beyond their goal" in spread.twins(rows)
    rows[0]["track_time_vs_anchor"] = 0.009
    assert "2 farther off, largest spread 1.50%, 0 beyond their goal" in spread.twins(rows)


def test_process_levels_reads_what_spread_reads(capsys):
    """docs/process_levels.py over the five recorded starts of 854b079: its pooled statistic is
    the recorded median, so its largest spreads are spread's; a repeated point splits into the
    three processes' values in the order repeat.pool appended them."""
    import importlib.util

    from conftest import ROOT
    from verify_attn_tools import spread

    spec = importlib.util.spec_from_file_location("process_levels", ROOT / "docs" / "process_levels.py")
    levels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(levels)
    files = [ROOT / "results" / "nvidia-h200" / "854b0790-reuse-py3.12.json",
             *sorted((ROOT / "results" / "nvidia-h200" / "starts").glob("854b0790-*.json.gz"))]
    assert len(files) == 5
    assert levels.main([str(f) for f in files]) == 0
    out = capsys.readouterr().out
    pooled = re.search(r"^pooled\s+([\d.]+)%\s+([\d.]+)%", out, re.M)
    assert spread.main([str(f) for f in files]) == 1  # tc misses both goals there, narrowly
    words = capsys.readouterr().out
    quick = re.search(r"# Quick: .* x anchor ([\d.]+)%", words).group(1)
    tc = re.search(r"# tc: .* x anchor largest ([\d.]+)%", words).group(1)
    assert (pooled.group(1), pooled.group(2)) == (quick, tc)
    values = levels.series(files[0])[("Chain", (16, 9, 16384, "tc"))][1]
    assert [len(p) for p in levels.processes(values)] == [8, 8, 8]
    assert levels.processes(values[:8]) == [values[:8]]
