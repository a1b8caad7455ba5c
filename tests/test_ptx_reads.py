"""ptx-reads: registers a kernel may read before writing them, BASE against the working tree (nvcc, no GPU)."""

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from verify_attn import build, resources
from verify_attn_tools import ptx_reads, sass

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def entry(body: str) -> str:
    return (".visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\t.reg .pred \t%p<4>;\n\t.reg .f32 \t%f<9>;\n"
            "\t.reg .b32 \t%r<9>;\n\t.reg .b64 \t%rd<4>;\n" + body + "\n\tret;\n\n}\n")


LOOP = """
\tld.param.u64 \t%rd1, [k_param_0];
\tmov.u32 \t%r1, %tid.x;
\t{MAX_BEFORE_LOOP}
$L__BB0_1:
\tld.global.f32 \t%f2, [%rd1];
\tmax.NaN.f32 \t%f3, %f1, %f2;
\tmov.f32 \t%f1, %f3;
\tadd.s32 \t%r1, %r1, 1;
\tsetp.lt.s32 \t%p1, %r1, 64;
\t@%p1 bra \t$L__BB0_1;
\tst.global.f32 \t[%rd1], %f1;"""


def test_a_loop_carried_value_set_before_the_loop_is_written():
    assert ptx_reads.undefined_reads(entry(LOOP.replace("{MAX_BEFORE_LOOP}", "mov.f32 \t%f1, 0fFF800000;"))) == {}


def test_a_loop_carried_value_unset_before_the_loop_is_read_before_any_write():
    found = ptx_reads.undefined_reads(entry(LOOP.replace("{MAX_BEFORE_LOOP}", "")))
    assert list(found) == ["k"] and [r[0] for r in found["k"]] == ["%f1"]
    assert "max.NaN.f32" in found["k"][0][1]


def test_a_register_written_on_one_branch_only_is_read_on_the_other():
    body = """
\tld.param.u64 \t%rd1, [k_param_0];
\tld.global.u32 \t%r1, [%rd1];
\tsetp.eq.s32 \t%p1, %r1, 0;
\t@%p1 bra \t$L__BB0_2;
\tmov.f32 \t%f1, 0f3F800000;
$L__BB0_2:
\tst.global.f32 \t[%rd1], %f1;"""
    assert [r[0] for r in ptx_reads.undefined_reads(entry(body))["k"]] == ["%f1"]
    assert ptx_reads.undefined_reads(entry(body.replace("\t@%p1 bra", "\tmov.f32 \t%f1, 0f00000000;\n\t@%p1 bra"))) == {}


def test_inline_assembly_labels_are_known_within_their_braces():
    """Two inlined copies of one wait loop, the same label in each: a branch goes to its own
    copy's label (the first copy's exit taken to the second's would skip the write between)."""
    wait = ("\t{\n\t.reg .pred p;\n\tLAB_WAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%r2], %r3;\n"
            "\t@p bra.uni DONE;\n\tbra.uni LAB_WAIT;\n\tDONE:\n\t}\n")
    body = ("\tmov.u32 \t%r2, 0;\n\tmov.u32 \t%r3, 1;\n" + wait + "\tmov.u32 \t%r4, 7;\n" + wait +
            "\tld.param.u64 \t%rd1, [k_param_0];\n\tst.global.u32 \t[%rd1], %r4;")
    assert ptx_reads.undefined_reads(entry(body)) == {}
    tokens = list(ptx_reads._tokens(body))
    assert [t[1:3] for t in tokens if t[0] == "label"] == [("LAB_WAIT", 1), ("DONE", 1), ("LAB_WAIT", 2), ("DONE", 2)]


def test_what_an_instruction_reads_and_writes():
    reg = ptx_reads.re.compile(r"%(?:rd|r|f|p)\d+\b")
    assert ptx_reads._parse("shfl.sync.bfly.b32 %r1|%p1, %r2, 16, 31, -1", reg) == (["%r2"], ["%r1", "%p1"])
    assert ptx_reads._parse("st.shared.v4.f32 [%r1], {%f1, %f2, %f3, %f4}", reg) == (
        ["%r1", "%f1", "%f2", "%f3", "%f4"], [])
    # a guarded instruction may not run: it writes nothing for certain
    assert ptx_reads._parse("@!%p2 ld.shared.v2.f32 {%f1, %f2}, [%r3+16]", reg) == (["%p2", "%r3"], [])
    assert ptx_reads._parse("setp.lt.s32 %p1|%p2, %r1, %r2, %p3", reg) == (["%r1", "%r2", "%p3"], ["%p1", "%p2"])
    assert ptx_reads._parse("bar.red.popc.u32 %r1, 0, %p1", reg) == (["%p1"], ["%r1"])
    assert ptx_reads._parse("bar.sync %r1, %r2", reg) == (["%r1", "%r2"], [])
    assert ptx_reads._parse("mbarrier.arrive.release.cta.shared::cta.b64 _, [%r5]", reg) == (["%r5"], [])
    assert ptx_reads._parse("cp.async.cg.shared.global [%r1], [%rd2], 16, %r3", reg) == (["%r1", "%rd2", "%r3"], [])


def test_a_guarded_write_is_not_a_write_on_the_path_where_the_guard_fails():
    body = """
\tld.param.u64 \t%rd1, [k_param_0];
\tld.global.u32 \t%r1, [%rd1];
\tsetp.eq.s32 \t%p1, %r1, 0;
\t@%p1 ld.global.f32 \t%f1, [%rd1+4];
\tst.global.f32 \t[%rd1], %f1;"""
    assert [r[0] for r in ptx_reads.undefined_reads(entry(body))["k"]] == ["%f1"]
    both = body.replace("\tst.global", "\t@!%p1 mov.f32 \t%f1, 0f00000000;\n\tst.global")
    assert [r[0] for r in ptx_reads.undefined_reads(entry(both))["k"]] == ["%f1"]  # the analysis does not pair guards


def test_a_statement_over_several_lines_and_a_label_before_a_brace():
    body = """
\tld.param.u64 \t%rd1, [k_param_0];
\tld.global.v4.f32 \t{%f1, %f2,
\t\t%f3, %f4}, [%rd1];
\t{
\t.reg .pred p;
\tsetp.ne.f32 p, %f1, %f2;
\t@p bra DONE;
\tmov.f32 \t%f5, %f3;
\tDONE: }
\tmov.f32 \t%f5, %f4;
\tst.global.v2.f32 \t[%rd1], {%f5, %f4};"""
    assert ptx_reads.undefined_reads(entry(body)) == {}
    labels = [t[1:3] for t in ptx_reads._tokens(body) if t[0] == "label"]
    assert labels == [("DONE", 1)]
    stmts = [t[1] for t in ptx_reads._tokens(body) if t[0] == "stmt"]
    assert "ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1]" in stmts and stmts[-1].startswith("st.global")


def test_an_indexed_branch_goes_to_its_targets():
    """brx.idx jumps to the labels its .branchtargets list names, not to the list's own label."""
    body = """
\tld.param.u64 \t%rd1, [k_param_0];
\tld.global.u32 \t%r1, [%rd1];
$L_brx_0: .branchtargets
\t$L__BB0_2,
\t$L__BB0_3;
\tbrx.idx \t%r1, $L_brx_0;
$L__BB0_2:
\tmov.f32 \t%f1, 0f3F800000;
\tbra.uni \t$L__BB0_4;
$L__BB0_3:
\tmov.f32 \t%f2, 0f3F800000;
$L__BB0_4:
\tst.global.f32 \t[%rd1], %f1;"""
    assert [r[0] for r in ptx_reads.undefined_reads(entry(body))["k"]] == ["%f1"]  # unset on the way through BB0_3


@needs_nvcc
def test_the_row_maximum_left_unset_is_found(tmp_path, monkeypatch, capsys):
    """A clone whose tc_mma starts a row's maximum at scores e < 2 (row 1's left to whatever
    its register held, a change that made NaN rows on an H100 and passed the CPU tests):
    `ptx-reads HEAD` exits 1 naming every configuration of tc_attn; the clone as committed, 0."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(sass.ROOT), str(clone)], check=True)
    monkeypatch.setattr(sass, "ROOT", clone)
    assert ptx_reads.main(["HEAD", "--sources", "tc_mma.cu", "--arch", "sm_90"]) == 0
    assert "none reads a register before writing it at a new place" in capsys.readouterr().out
    src = clone / "kernels" / "tc_mma.cu"
    text = src.read_text()
    assert "nt == 0 && (e & 1) == 0 ? v" in text
    src.write_text(text.replace("nt == 0 && (e & 1) == 0 ? v", "nt == 0 && e < 2 ? v"))
    assert ptx_reads.main(["HEAD", "--sources", "tc_mma.cu", "--arch", "sm_90"]) == 1
    out = capsys.readouterr().out
    flagged = [line for line in out.splitlines() if line.endswith("at new places") and not line.startswith("3 kernels")]
    assert len(flagged) == 3 and all(line.startswith("sm_90 tc_mma.cu tc_attn<") for line in flagged), out
    # each read named by the line it comes from: the planted one, max.NaN inlined there
    assert "tc_mma.cu:" in out and "nt == 0 && e < 2 ? v" in out and "max.NaN.f32" in out, out


def test_an_unknown_revision_or_source_exits_2(capsys):
    assert ptx_reads.main(["no-such-revision"]) == 2
    assert "not a commit" in capsys.readouterr().err
    assert ptx_reads.main(["HEAD", "--sources", "nope.cu"]) == 2
    assert "--sources: no such kernel source" in capsys.readouterr().err


def test_ab_lists_the_kernels_that_read_more_before_writing(monkeypatch):
    """ab, where kernels/ changed: the head's kernels with more such reads than the base's, under
    its table and in its JSON, for this GPU's architecture only; nothing where kernels/ did not
    change; a comparison that cannot run says so."""
    from verify_attn_tools import ab

    seen = []
    Read = ptx_reads.Read
    select = Read("%r1", "mov.b32 %f2, %r1;", "flash.cu:138", "f[j] = i < nq ? f[j] * qscale : 0.f;")
    base = {("sm_90", "tc_mma.cu", "tc_attn<2,4,2,2,2,1>"): [], ("sm_90", "flash.cu", "flash_split"): [select]}
    unset = Read("%f7", "max.NaN.f32 %f1, %f7, %f2;", "tc_mma.cu:160", "mx = e < 2 ? v : nan_max(mx, v);")
    # flash's read moved to another line number and register: the same place, not new
    head = {("sm_90", "tc_mma.cu", "tc_attn<2,4,2,2,2,1>"): [unset],
            ("sm_90", "flash.cu", "flash_split"): [Read("%r9", "mov.b32 %f3, %r9;", "flash.cu:140", select.source)]}
    monkeypatch.setattr(ptx_reads, "both", lambda sha, sources, archs: seen.append(archs) or (base, head))
    monkeypatch.setattr(ab, "git", lambda *a: "kernels/tc_mma.cu\n")
    found = ab.unset_reads("0" * 40, (9, 0))
    assert seen == [("sm_90",)] and found["arch"] == "sm_90a" and found["status"] == "compared"
    assert found["kernels"] == [{"source": "tc_mma.cu", "kernel": "tc_attn<2,4,2,2,2,1>",
                                 "reads": [dataclasses.asdict(unset)]}]
    lines = ab.unset_lines(found)
    assert "kernels that read one at a new place: 1**" in lines[0]
    assert lines[1:] == ["- tc_mma.cu `tc_attn<2,4,2,2,2,1>`: 1, e.g. `%f7` at tc_mma.cu:160 "
                         "`mx = e < 2 ? v : nan_max(mx, v);`"]
    monkeypatch.setattr(ptx_reads, "both", lambda *a: (base, base))
    assert "no kernel reads one at a place" in ab.unset_lines(ab.unset_reads("0" * 40, (12, 0)))[0]
    assert "not an architecture" in ab.unset_reads("0" * 40, (8, 9))["status"]

    def no_nvcc(*a):
        raise RuntimeError("nvcc not found: put CUDA's bin on PATH or set CUDA_HOME")

    monkeypatch.setattr(ptx_reads, "both", no_nvcc)
    assert ab.unset_lines(ab.unset_reads("0" * 40, (9, 0))) == [
        "\nRegisters read before a write (sm_90a, PTX): not compared: nvcc not found: put CUDA's bin on PATH or set CUDA_HOME"]
    monkeypatch.setattr(ab, "git", lambda *a: "")
    assert ab.unset_reads("0" * 40, (9, 0))["status"] == "kernels unchanged"
    assert ab.unset_lines(ab.unset_reads("0" * 40, (9, 0))) == []

@needs_nvcc
def test_no_kernel_reads_a_register_before_writing_it_at_an_unrecorded_place():
    """Every kernel of the build on every architecture of the resource report against the
    source lines in tests/data/ptx_reads.json, read as places where no value depends on the
    read (flash computes both sides of a select past the last query row; tc_attn_ws branches
    twice on one predicate). A read at another line fails CI on a machine without a GPU:
    `python -m verify_attn ptx-reads main` shows it; record a line only for a read no value
    depends on."""
    recorded = json.loads((Path(__file__).parent / "data" / "ptx_reads.json").read_text())
    found = ptx_reads.scan(build.kernels_dir(), list(build.spec(cuda=True).kernel_sources), resources.ARCHS)
    over = {}
    for (a, s, k), reads in found.items():
        places = {tuple(p) for p in recorded.get(a, {}).get(s, {}).get(k, [])}
        new = [r for r in reads if r.same_line() not in places]
        if new:
            over[a, s, k] = new
    assert not over, "\n".join(f"{a} {s} {k}: {r[0].register} at {r[0].where} `{r[0].source}` ({len(r)} such reads)"
                                for (a, s, k), r in over.items())
    assert len(found) >= 20  # every kernel was read: a source that compiled to nothing would pass
