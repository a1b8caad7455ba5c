"""The landing page (verify_attn_tools/landing.py): its rows are the points the suite times, its
hardware line shows every change it names, and its verdict line counts points in report's terms."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verify_attn import grid
from verify_attn_tools import landing

ROOT = Path(__file__).resolve().parent.parent
QUICK = "bench_verify_attn.Quick.track_time"


def quick_times(results: Path, commit: str, date: int, times: dict):
    """Quick's times {impl: seconds} at heads 64, q_len 9, prefix 65,536, through asv's own API."""
    from asv import results as asv_results, runner

    machine = results / "nvidia-h200"
    machine.mkdir(parents=True, exist_ok=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "nvidia-h200", "version": 1}))
    res = asv_results.Results({"machine": "nvidia-h200"}, {}, commit, date, "3.12", "reuse-py3.12", {})
    params = [["64"], ["9"], ["65536"], [repr(i) for i in times]]
    res.add_result({"name": QUICK, "params": params, "version": "1"},
                   runner.BenchmarkResult(list(times.values()), [None] * len(times), [None] * len(times), 0, "", None))
    res.save(str(results))


def quick_rows(results: Path, timed: list[str]) -> list[str]:
    (results / "benchmarks.json").write_text(json.dumps({QUICK: {
        "param_names": ["heads", "q_len", "prefix_len", "impl"],
        "params": [["64"], ["9"], ["65536"], [repr(i) for i in timed]]}}))
    m = landing.machine_page(results, "nvidia-h200", json.loads((results / "benchmarks.json").read_text()))
    return [p.impl for p in m.points if p.cls == "Quick"]


def test_rows_leave_out_what_the_suite_no_longer_times_there(tmp_path):
    """tc_wgmma is gated but not timed at Quick's points (grid.GATED_ONLY): an older commit's time
    of it gives no row of "-" and a link to an empty graph; one the suite still times keeps its row."""
    results = tmp_path / "results"
    quick_times(results, "a" * 40, 1000, {"tc": 1.3e-4, "flash": 2e-4, "tc_wgmma": 1.2e-4})
    quick_times(results, "b" * 40, 2000, {"tc": 1.3e-4, "flash": 2e-4})
    assert "tc_wgmma" in landing.IMPLS and "tc_wgmma" in grid.GATED_ONLY
    assert quick_rows(results, ["tc", "flash"]) == ["tc", "flash"]
    assert quick_rows(results, ["tc", "flash", "tc_wgmma"]) == ["tc", "tc_wgmma", "flash"]


def test_every_row_of_the_recorded_results_is_a_timed_point():
    bench = ROOT / "results" / "benchmarks.json"
    if not bench.exists():
        pytest.skip("no results/ in this checkout")
    benchmarks = json.loads(bench.read_text())
    m = landing.machine_page(ROOT / "results", "nvidia-h200", benchmarks)
    assert m.points
    for p in m.points:
        assert p.impl in landing.timed_impls(benchmarks, p.cls), (p.cls, p.impl)
    assert not [p for p in m.points if p.cls == "Quick" and p.impl in grid.GATED_ONLY]


def test_a_count_that_moves_under_its_rounding_shows_in_bytes():
    old, new = {"track_dynamic_smem_bytes": 224908.0}, {"track_dynamic_smem_bytes": 224924.0}
    assert landing.moved(new, old) == ["dynamic smem 224,908→224,924 bytes"]
    assert landing.moved({"track_dynamic_smem_bytes": 122880.0}, {"track_dynamic_smem_bytes": 120832.0}) == [
        "KiB dynamic smem 118→120"]
    assert landing.moved({"track_registers": 176.0}, {"track_registers": 168.0}) == ["registers 168→176"]
    # The SM tail by its two decimals: 1.124 -> 1.136 shows as 1.12 -> 1.14 and is named.
    assert landing.moved({"track_sm_tail": 1.136}, {"track_sm_tail": 1.124}) == ["SM tail 1.12→1.14x"]
    assert landing.moved({"track_sm_tail": 1.13}, {"track_sm_tail": 1.12}) == []


def test_the_verdict_line_counts_points_as_report_does():
    files = landing.results_files(ROOT / "results", "nvidia-h200")
    if len(files) < 2:
        pytest.skip("fewer than two recorded commits")
    benchmarks = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    summary = landing.machine_page(ROOT / "results", "nvidia-h200", benchmarks).summary
    out = subprocess.run([sys.executable, "-m", "verify_attn", "report", files[-2][0], files[-1][0]], cwd=ROOT,
                         capture_output=True, text=True).stdout

    def number(pattern, text):
        found = re.search(pattern, text)
        return found and int(found.group(1))

    assert number(r"(\d+) counted points", summary) == number(r"(\d+) counted points", out)
    assert number(r"(\d+) raw only", summary) == number(r"(\d+) raw only", out)
    assert "points judged" not in summary and " of them judged on the drift-free series" in summary
