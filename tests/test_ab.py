"""The paired check (`python -m verify_attn ab`): its rule on made-up samples, the base's
build in its own namespace, and, in a copy of this repository on the CPU, a correctness break
exits 2 untimed and a 2x slowdown of flash's CPU twin exits 1."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, checkout_copy
from verify_attn import revision
from verify_attn_tools import ab, detect

from test_quick_gate import PLANT


def test_sign_test_p_values():
    assert ab.sign_p(10, 10) == pytest.approx(2 / 1024)
    assert ab.sign_p(0, 10) == pytest.approx(2 / 1024)
    assert ab.sign_p(17, 20) == pytest.approx(2 * sum(__import__("math").comb(20, k) for k in range(17, 21)) / 2**20)
    assert ab.sign_p(17, 20) < ab.ALPHA < ab.sign_p(16, 20)
    assert ab.sign_p(5, 10) == 1.0 and ab.sign_p(0, 0) == 1.0


def test_the_rule_needs_both_the_factor_and_the_sign_test():
    base = [1.0 + 0.001 * (k % 5) for k in range(20)]
    assert ab.judge(base, [b * 1.02 for b in base], 1.01)[0] == "slower"
    assert ab.judge(base, [b / 1.02 for b in base], 1.01)[0] == "faster"
    # Every pair 0.5% slower: significant, under the factor.
    status, ratio, slower, p = ab.judge(base, [b * 1.005 for b in base], 1.01)
    assert status == "same" and slower == 20 and p < ab.ALPHA and ratio == pytest.approx(1.005)
    # A median 3% slower from 12 of 20 pairs: over the factor, not significant.
    mixed = [b * (1.03 if k % 5 < 3 else 0.99) for k, b in enumerate(base)]
    assert ab.judge(base, mixed, 1.01)[0] == "same"


def test_every_registration_moves_to_the_base_namespace():
    text = (b'TORCH_LIBRARY(verify_attn, m) {}\nTORCH_LIBRARY_IMPL(verify_attn, CPU, m) {}\n'
            b'TORCH_LIBRARY_FRAGMENT( verify_attn , m) {}\n#include "verify_attn.h"\nnamespace verify_attn {}\n')
    out = revision.renamed(text, "va_base").decode()
    assert out.count("(va_base,") == 3 and '#include "verify_attn.h"' in out and "namespace verify_attn {}" in out
    lib, impls = revision.library(ROOT, "HEAD", "va_base")
    assert not any(revision.LIBRARY.search(data.decode()) for data in lib.files.values())
    assert sum(b"(va_base," in data for data in lib.files.values()) >= 2  # binding.cpp and the generated ops
    assert "-Dverify_attn=va_base" in lib.cxx_flags
    assert {"naive", "flash"} <= set(impls)


def test_a_revision_before_the_plans_path_gets_that_contracts_binding():
    """kernels/ from before the plan's path argument (411a33c) build with plans that take no
    path, and without the pinned-path variants, which that contract cannot express."""
    from verify_attn import build, registry

    old = build._cuda_binding([registry.get("tc")], legacy=True)
    assert "plan_tc(const Params& p, int num_sms);" in old and 'run_cuda(plan_tc, launch_tc, "tc",' in old
    assert "int num_sms, int path" in build._cuda_binding([registry.get("tc_mma")])
    _, impls = revision.library(ROOT, "411a33c", "va_base")
    assert "tc_mma" not in impls


def test_a_revision_that_is_not_there_is_refused():
    with pytest.raises(revision.RevisionError, match="no-such-revision"):
        revision.library(ROOT, "no-such-revision", "va_base")


def test_a_base_lacking_a_kernels_sources_builds_without_it(tmp_path):
    """A commit that lacks a source the registry compiles builds the rest (ab shows that kernel
    as new, untimed); one without the op binding at all is refused, saying why."""
    from conftest import git

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "binding.cpp").write_text("// only the binding\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "no header")
    with pytest.raises(revision.RevisionError, match="predates the registry's op binding"):
        revision.library(tmp_path, "HEAD", "va_base")
    (tmp_path / "kernels" / "verify_attn.h").write_text("// kAnyPath\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "kernels without their sources")
    assert revision.library(tmp_path, "HEAD", "va_base")[1] == []


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return checkout_copy(tmp_path_factory.mktemp("ab"))


def run_ab(repo, env, tmp_path, *extra):
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, "-m", "verify_attn", "ab", "main", "--json", str(out), *extra], cwd=repo,
                          env=env, capture_output=True, text=True)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_a_correctness_break_exits_2_untimed(copy, tmp_path):
    repo, env = copy
    cpu = repo / "kernels" / "cpu.cpp"
    clean = cpu.read_text()
    try:
        cpu.write_text(clean.replace(*PLANT))
        proc, result = run_ab(repo, env, tmp_path)
    finally:
        cpu.write_text(clean)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Nothing timed: the checkout fails named cases" in proc.stdout and "+ working tree" in proc.stdout
    assert result["rows"] == [] and result["failed"] and all(f.startswith("flash on ") for f in result["failed"])


def test_a_2x_slowdown_of_flash_exits_1(copy, tmp_path):
    repo, env = copy
    cpu = repo / "kernels" / "cpu.cpp"
    clean = cpu.read_text()
    try:
        detect.edit_flash(repo, 100, "planted 2x", heads=(8,), cpu=True)
        # At prefix 0 flash's CPU call is 0.5-1.4 ms and the plant spins in part of it (1.27-1.38x):
        # on a loaded 2-core box 3 or 4 of 20 pairs read the other way (sign test p 0.012-0.021).
        proc, result = run_ab(repo, env, tmp_path, "--pairs", "40")
        # Chain's points on the CPU's grid (the tiny one has none): heads 8, q_len 9, prefix 2,048,
        # a chain padded to 64 rows; naive is not in Chain.
        cpu_grid = {k: v for k, v in env.items() if k != "VERIFY_ATTN_GRID"}
        chain, chain_result = run_ab(repo, cpu_grid, tmp_path, "--pairs", "40", "--points", "chain", "--impl", "flash")
    finally:
        cpu.write_text(clean)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["impl"], r["point"]): r for r in result["rows"]}
    assert set(rows) == {(i, f"h8 q9 p{p}") for i in ("naive", "flash") for p in (0, 2048)}
    assert all(r["plan_moved"] is False for r in rows.values())  # CPU ops have no launch plan
    for p in (0, 2048):
        r = rows[("flash", f"h8 q9 p{p}")]
        assert r["status"] == "slower" and r["ratio"] > 1.2 and r["pairs"] >= 10, r
    assert proc.stdout.startswith(f"**verify-attn ab {result['base'][:8]} -> ")
    assert " on cpu:" in proc.stdout.splitlines()[0] and result["gpu"] is None  # the headline names the device
    assert chain.returncode == 1 and chain_result["points"] == ["chain"], chain.stdout[-3000:] + chain.stderr[-3000:]
    assert [(r["impl"], r["point"], r["status"]) for r in chain_result["rows"]] == [("flash", "h8 q9 p2048", "slower")]
    assert "(chain points): slower" in chain.stdout


def test_the_table_reads_in_words_with_the_pairs_spread():
    rows = [ab.Row("h64 q9 p65536", "tc", "slower", 1e-4, 1.018e-4, 1.018, 18, 20, 0.0004, iqr=(1.016, 1.020),
                   clock_mhz=1980.0),
            ab.Row("h64 q9 p2048", "flash", "faster", 1e-4, 0.758e-4, 0.758, 1, 20, 0.00004, iqr=(0.75, 0.76))]
    text = ab.markdown(rows, "aaaaaaaa", "bbbbbbbb", "cuda", 1.01, [])
    assert "slower (1 slower, worst tc at h64 q9 p65536 1.8% slower)" in text.splitlines()[0]
    assert "| h64 q9 p65536 | tc | 0.1000 ms | 0.1018 ms | 1.8% slower | 0.4% | 18/20 |" in text
    assert "| 1.32x faster | 1.3% |" in text and "x1.0" not in text
    assert ab.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)


def test_several_selections_name_their_class_in_one_table():
    rows = [dataclasses.replace(ab.Row("h8 q9 p2048", "tc", "slower", 1e-4, 1.05e-4, 1.05, 20, 20, 1e-6), selection="chain"),
            dataclasses.replace(ab.Row("b8 h16 q9", "tc", "same", 1e-4, 1e-4, 1.0, 10, 20, 1.0), selection="serving_chain"),
            ab.Row("h64 q9 p2048", "tc", "same", 1e-4, 1e-4, 1.0, 10, 20, 1.0)]
    text = ab.markdown(rows, "aaaaaaaa", "bbbbbbbb", "cuda", 1.01, [], ("quick", "chain", "serving_chain"))
    head = text.splitlines()[0]
    assert "(quick, chain, serving_chain points): slower (1 slower, worst tc at Chain h8 q9 p2048 5.0% slower)" in head
    assert "| Chain h8 q9 p2048 | tc |" in text and "| ServingChain b8 h16 q9 | tc |" in text
    assert "| Quick h64 q9 p2048 | tc |" in text
    # One selection keeps the plain point names and the old heading.
    one = ab.markdown(rows[:1], "aaaaaaaa", "bbbbbbbb", "cuda", 1.01, [], ("chain",))
    assert "(chain points): slower" in one and "| h8 q9 p2048 | tc |" in one


def test_points_the_grid_lacks_are_refused_before_any_build(monkeypatch, capsys):
    monkeypatch.setenv("VERIFY_ATTN_GRID", "tiny")  # its serving selection is empty
    assert ab.main(["main", "--points", "serving"]) == 2
    assert "--points serving: this device's grid" in capsys.readouterr().err


def test_source_sets_the_bases_page_beside_the_heads(tmp_path, monkeypatch, capsys):
    """--source: after the pairs, the base's and the head's pages of each point profiled in one
    ncu process (profile.run_source with base) are compared as the stalls verb compares them."""
    import types

    from verify_attn import ncu, profile, stalls
    from verify_attn_tools import stalls as stalls_verb

    page = (Path(__file__).parent / "data" / "ncu_source_tc_attn_tma.csv").read_text()
    edited = page.replace('"16","0","16","18324"', '"116","0","116","18324"')  # the first FMNMX: 100 more
    asked = []

    def summary(text, name, top):  # what run_source gives a point: its kernel, its page, the summary
        return {"kernel": "tc_attn_tma", "page": str(tmp_path / name),
                **stalls.summarise(stalls.parse(text)[1], top)}

    def run_source(points, variant, names, top, base):
        asked.append((points, variant, names, top, base))
        if variant == "serving_chain":
            raise ncu.NcuError("stand-in: ncu failed")
        got = {(64, 9, 65536, "tc"): summary(edited, "h.csv", top),
               (64, 9, 65536, "tc@va_base"): summary(page, "b.csv", top)}
        return {"points": got, "skipped": {(8, 9, 65536, "tc@va_base"): "fails its check: stand-in"}}

    monkeypatch.setattr(profile, "run_source", run_source)
    args = types.SimpleNamespace(impl=None, source=[("chain", (64, 9, 65536)), ("chain", (8, 9, 65536)),
                                                    ("serving_chain", (8, 16, 9))])
    out = ab.source_pages(args, "0123abcd")
    # one ncu process a selection, every source line kept for the comparison
    assert asked[0] == ([(64, 9, 65536), (8, 9, 65536)], "chain", ["tc"], stalls_verb.ALL, "0123abcd")
    assert [(c["point"], c["impl"]) for c in out] == [([64, 9, 65536], "tc")]
    assert out[0]["samples"]["change"] == 100 and out[0]["kinds"]["other"]["change"] == 100
    text = capsys.readouterr()
    assert "chain h64 q9 p65536 tc, base -> head:\ntc_attn_tma (b.csv) -> tc_attn_tma (h.csv)" in text.out
    assert "device.h:25" in text.out
    assert "chain h8 q9 p65536 tc: not profiled on both sides ({(8, 9, 65536, 'tc@va_base'): 'fails its check" in text.out
    assert "ab --source: stand-in: ncu failed" in text.err  # the verdict stands; one line says why
