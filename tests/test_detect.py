"""The detection-power tool can still plant its slowdown, and the plant keeps the output."""

import shutil
import subprocess
from pathlib import Path

import pytest

from verify_attn_tools import detect

ROOT = Path(__file__).resolve().parent.parent


def test_the_planted_loop_applies(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 5, "plant")
    text = (tmp_path / "kernels" / "flash.cu").read_text()
    assert detect.planted_loop(5) in text and detect.LOOP not in text
    detect.edit_flash(tmp_path, None, "a later commit")  # a commit after the plant still applies
    assert text in (tmp_path / "kernels" / "flash.cu").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_planted_kernel_compiles(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    detect.edit_flash(tmp_path, 10, "plant")
    subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-c", "-o", str(tmp_path / "f.o"),
                    str(tmp_path / "kernels" / "flash.cu")], check=True, capture_output=True)
