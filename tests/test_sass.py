"""sass: kernels' machine code compared between a revision and the working tree (nvcc, no GPU)."""

import shutil
import subprocess

import pytest

from verify_attn_tools import sass

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
INS = sass.INSTRUCTION


def test_one_inserted_instruction_counts_once():
    a = b"".join(bytes([i]) * INS for i in range(10))
    b = a[:5 * INS] + b"\xff" * INS + a[5 * INS:]
    assert sass.differing(a, a) == (0, 0)
    assert sass.differing(a, b) == (0, 1)
    assert sass.differing(b, a) == (1, 0)
    changed = a[:3 * INS] + b"\xee" * INS + a[4 * INS:]
    assert sass.differing(a, changed) == (1, 1)


@needs_nvcc
def test_the_kernels_of_a_cubin_are_its_text_sections(tmp_path):
    """Kernels only (a device function kept out of line is not one), by their mangled names."""
    (tmp_path / "k.cu").write_text(
        "__device__ __noinline__ float twice(float x) { return 2 * x; }\n"
        "__global__ void one(float* p) { p[threadIdx.x] = twice(p[threadIdx.x]); }\n"
        "__global__ void two(float* p) { p[threadIdx.x] += 1.f; }\n")
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")],
                   check=True)
    code = sass.text_sections((tmp_path / "k.cubin").read_bytes())
    assert sorted(code) == ["_Z3onePf", "_Z3twoPf"]
    assert all(len(c) % INS == 0 and c for c in code.values())


@needs_nvcc
def test_a_change_to_one_kernel_moves_that_kernel_alone(tmp_path, monkeypatch, capsys):
    """A clone of this repository, naive_softmax's expf turned into __expf in its working tree:
    `sass HEAD` names that kernel and leaves naive's other two identical."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(sass.ROOT), str(clone)], check=True)
    src = clone / "kernels" / "naive.cu"
    text = src.read_text()
    assert "expf(s[c] - m)" in text
    src.write_text(text.replace("expf(s[c] - m)", "__expf(s[c] - m)"))
    monkeypatch.setattr(sass, "ROOT", clone)
    assert sass.main(["HEAD", "--sources", "naive.cu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[2].strip(" `"): line for line in out.splitlines() if line.startswith("| naive.cu")}
    assert set(rows) == {"naive_scores", "naive_softmax", "naive_output"}, out
    assert "**-" in rows["naive_softmax"] and "identical" not in rows["naive_softmax"], out
    assert "identical" in rows["naive_scores"] and "identical" in rows["naive_output"], out
    assert "3 kernels: 2 identical, 1 moved" in out


def test_an_unknown_revision_exits_2(capsys):
    assert sass.main(["no-such-revision"]) == 2
    assert "not a commit of this repository" in capsys.readouterr().err
