"""The detection-power tool can still plant its slowdown (at heads 64, or at heads 8 and 16
only), the plant keeps the output, and it reads asv compare's Quick rows."""

import shutil
import subprocess
from pathlib import Path

import pytest

from verify_attn_tools import detect

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("plant", ["time", "work"])
def test_the_planted_loop_applies(tmp_path, plant):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 5, "plant", plant=plant)
    text = (tmp_path / "kernels" / "flash.cu").read_text()
    assert detect.planted_loop(5, plant=plant) in text and text.count("planted 5%") == 1
    assert ("struct DetectPlant" in text) == (plant == "time")
    detect.edit_flash(tmp_path, None, "a later commit")  # a commit after the plant still applies
    assert text in (tmp_path / "kernels" / "flash.cu").read_text()


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
