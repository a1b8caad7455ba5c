"""sass: kernels' machine code compared between a revision and the working tree (nvcc, no GPU)."""

import dataclasses
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


@needs_nvcc
def test_ab_says_whether_a_slower_kernels_machine_code_moved(tmp_path, monkeypatch):
    """ab's rows for kernels it finds slower: tc's sources unchanged in a clone whose flash.cu
    changed -> tc identical, flash moved; the table and report's PR line say so, and the note
    on copies' levels comes with an identical one."""
    from verify_attn_tools import ab, report

    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(sass.ROOT), str(clone)], check=True)
    src = clone / "kernels" / "flash.cu"
    src.write_text(src.read_text() + "\n__global__ void planted_kernel(float* p) { p[0] = 1.f; }\n")
    monkeypatch.setattr(sass, "ROOT", clone)
    monkeypatch.setattr(sass.build, "spec", lambda cuda=True: type("S", (), {"cuda_flags": ("-O3",)})())
    real = ab.registry.get
    quick = {"tc": dataclasses.replace(real("tc"), cuda_sources=("tc_mma.cu",))}  # one source: a quick compile
    monkeypatch.setattr(ab.registry, "get", lambda name: quick.get(name) or real(name))
    rows = [ab.Row("h64 q9 p2048", "tc", "slower", 1.0, 1.02, 1.02, 20, 20, 1e-6, iqr=(1.01, 1.03)),
            ab.Row("h64 q9 p2048", "flash", "slower", 1.0, 1.02, 1.02, 20, 20, 1e-6, iqr=(1.01, 1.03)),
            ab.Row("h64 q9 p2048", "naive", "same", 1.0, 1.0, 1.0, 10, 20, 1.0, iqr=(0.99, 1.01))]
    ab.machine_code(rows, "HEAD", "sm_80")
    assert [r.code for r in rows] == ["identical", "moved", ""]
    table = ab.markdown(rows, "base", "head", "cuda", 1.01, [])
    assert "slower (machine code identical)" in table and "slower (machine code moved)" in table
    assert report.IDENTICAL_NOTE in table
    line = report.ab_line({"point": "h64 q9 p2048", "impl": "tc", "status": "slower", "ratio": 1.02,
                           "base_s": 1e-3, "head_s": 1.02e-3, "slower": 20, "pairs": 20, "code": "identical"}, {})
    assert "(machine code identical)" in line


def test_ab_compares_no_machine_code_on_a_cpu_run():
    from verify_attn_tools import ab

    rows = [ab.Row("h8 q9 p0", "flash", "slower", 1.0, 1.02, 1.02, 20, 20, 1e-6)]
    ab.machine_code(rows, "HEAD", None)
    assert rows[0].code == ""


def test_a_slower_kernel_whose_launch_plan_changed_is_not_called_identical(monkeypatch):
    """A change to the host code alone (the plan picks another path or split) leaves every
    kernel's instructions identical while another kernel runs at the point: ab says the plan
    changed, compiles nothing for it, and does not add the two-copies note."""
    from verify_attn_tools import ab, report

    monkeypatch.setattr(sass, "moved_sources", lambda *a: pytest.fail("nothing to compile: the plan moved"))
    rows = [ab.Row("h8 q9 p16384", "tc", "slower", 1.0, 1.03, 1.03, 20, 20, 1e-6, iqr=(1.02, 1.04), plan_moved=True)]
    ab.machine_code(rows, "HEAD", "sm_90a")
    assert rows[0].code == "plan"
    table = ab.markdown(rows, "base", "head", "cuda", 1.01, [])
    assert "slower (launch plan changed)" in table and report.IDENTICAL_NOTE not in table
    line = report.ab_line({"point": "h8 q9 p16384", "impl": "tc", "status": "slower", "ratio": 1.03,
                           "base_s": 1e-3, "head_s": 1.03e-3, "slower": 20, "pairs": 20, "code": "plan"}, {})
    assert "(launch plan changed)" in line
