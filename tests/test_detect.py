"""The detection-power tool can still plant its slowdown (at heads 64, or at heads 8 and 16
only), the plant keeps the output, and it reads asv compare's Quick rows."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verify_attn_tools import detect

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("plant", ["time", "work"])
def test_the_planted_loop_applies(tmp_path, plant):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 5, "plant", plant=plant)
    text = (tmp_path / "kernels" / "flash.cu").read_text()
    assert detect.planted(5, plant=plant)[1] in text and text.count("planted 5%") == 1
    assert ("struct DetectPlant" in text) == (plant == "time")
    detect.edit_flash(tmp_path, None, "a later commit")  # a commit after the plant still applies
    assert text in (tmp_path / "kernels" / "flash.cu").read_text()


def test_the_cpu_plant_applies(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 100, "plant", heads=(8,), cpu=True)
    text = (tmp_path / "kernels" / "cpu.cpp").read_text()
    assert "DetectPlant detect_plant(p.heads == 8 ? 100 : 0);" in text and "#include <chrono>" in text
    assert (tmp_path / "kernels" / "flash.cu").read_text() == (ROOT / "kernels" / "flash.cu").read_text()


def test_the_plant_targets_the_head_counts_asked(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 3, "plant", heads=(8, 16))
    text = (tmp_path / "kernels" / "flash.cu").read_text()
    assert "DetectPlant detect_plant(clock64(), p.heads == 8 || p.heads == 16 ? 3 : 0);" in text
    assert "p.heads == 64" not in text
    detect.edit_flash(tmp_path, 3, "plant", heads=(8, 16), plant="work")
    text = (tmp_path / "kernels" / "flash.cu").read_text()
    assert "(p.heads == 8 || p.heads == 16 ? (key_end - key_begin) * 3 / 100 : 0)" in text


def test_compare_rows_are_read_with_their_head_count():
    table = """
| Change   | Before [aaaaaaaa]    | After [bbbbbbbb]    |   Ratio | Benchmark (Parameter)                                    |
|----------|----------------------|---------------------|---------|----------------------------------------------------------|
| +        | 1.20±0.01ms          | 1.31±0.01ms         |    1.09 | bench_verify_attn.Quick.track_time(16, 9, 65536, 'flash') |
|          | 31.7±0.1μs           | 31.8±0.1μs          |    1.00 | bench_verify_attn.Quick.track_time(64, 9, 2048, 'tc')     |
|          | n/a                  | n/a                 |     n/a | bench_verify_attn.Quick.track_time(8, 33, 0, 'tc')        |
|          | 0.05                 | 0.06                |   ~1.02 | bench_verify_attn.Quick.track_time_vs_naive(8, 9, 65536, 'flash') |
"""
    assert detect.ratios(table) == {"flash h16 q9 p65536": {"ratio": "1.09", "mark": "+"},
                                    "tc h64 q9 p2048": {"ratio": "1.00", "mark": ""}}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("plant", ["time", "work"])
def test_the_planted_kernel_compiles(tmp_path, plant):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 10, "plant", heads=(8, 16), plant=plant)
    subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-c", "-o", str(tmp_path / "f.o"),
                    str(tmp_path / "kernels" / "flash.cu")], check=True, capture_output=True)


def test_sizes_name_their_head_counts_and_runs():
    vs = [detect.variant(s, (64,), 3) for s in ("0x20", "2x10", "3", "2@8,16x10")]
    assert [(v.pct, v.heads, v.runs) for v in vs] == [(0, (), 20), (2, (64,), 10), (3, (64,), 3), (2, (8, 16), 10)]
    assert len({v.branch for v in vs}) == 4
    rounds = detect.rounds(vs)
    assert len(rounds) == 20 and len(rounds[0]) == 4 and rounds[19] == [vs[0]]
    with pytest.raises(ValueError, match="not in the grid"):
        detect.variant("2@7")
    with pytest.raises(ValueError, match="PCT"):
        detect.variant("2%")


def test_paired_runs_the_base_once_a_round(tmp_path):
    """The mechanics on the CPU (the plant is in the CUDA kernel, so nothing is slower here):
    one round, the base run once, each size run and compared with it, the table read."""
    from conftest import checkout_copy

    repo, env = checkout_copy(tmp_path)
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", "ci"], cwd=repo, env=env,
                   check=True, capture_output=True)
    out, log = tmp_path / "detect.json", tmp_path / "detect.log"
    proc = subprocess.run([sys.executable, "-m", "verify_attn", "detect", "--machine", "ci", "--check", "paired",
                           "--sizes", "0x1", "3@8x1", "--json", str(out), "--log", str(log)],
                          cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["variant"] for r in runs] == ["0% (no-op)", "3% at heads 8"]
    for r in runs:
        assert r["exit"] in (0, 1) and r["flagged"] == (r["exit"] == 1)
        assert set(r["cases"]) == {f"{i} h8 q9 p{p}" for i in ("naive", "flash") for p in (0, 2048)}
    commits = [line for line in log.read_text().splitlines() if " run " in line and "For verify-attn commit" in line]
    assert len(commits) == 3  # the base once, then the two sizes
