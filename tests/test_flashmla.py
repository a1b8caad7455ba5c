"""FlashMLA, the optional peer (verify_attn/flashmla.py): skipped with its reason unless
$VERIFY_ATTN_FLASHMLA names a checkout; then built through the content-addressed cache and
checked against the reference on chain cases whose cache is laid out in 64-token pages."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verify_attn import cases, flashmla, ops, registry
from verify_attn.candidate import Candidate, check
from verify_attn_tools.check import main as check_main

ROOT = Path(__file__).resolve().parent.parent
UNSET = "set VERIFY_ATTN_FLASHMLA to a FlashMLA checkout to time it"


@pytest.fixture
def no_checkout(monkeypatch):
    monkeypatch.delenv(flashmla.ENV, raising=False)


def test_without_the_checkout_every_consumer_skips_it_with_the_reason(no_checkout):
    entry = registry.get("flashmla")
    assert not entry.under_test and entry.trees == "chain" and not entry.paged
    assert entry.unsupported("cpu") == UNSET
    assert entry.unsupported("cuda", (9, 0)) == UNSET
    assert ops.unsupported("flashmla", "cpu") == UNSET
    assert entry.rejects(chain=False, paged=False) == "flashmla takes chain trees only (causal masks)"
    assert entry.rejects(chain=True, paged=True) == "flashmla does not take one-token pages"


def test_check_prints_a_skip_line_with_the_reason(no_checkout, capsys):
    """The skip says why; with nothing else chosen nothing was checked, which fails."""
    assert check_main(["--device", "cpu", "--impl", "flashmla", "--case", "chain_1x16x17x1041"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert lines[0].startswith("SKIP flashmla") and "chain_1x16x17x1041" in lines[0]
    assert lines[0].endswith(f"({UNSET})")
    assert len(lines) == 2 and lines[1].startswith("FAIL nothing checked")


def _fake_checkout(root: Path) -> Path:
    for name in flashmla.NEEDED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"// {name}\n")
    return root


def test_reasons_name_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv(flashmla.ENV, str(tmp_path / "nowhere"))
    assert flashmla.unavailable("cuda", (9, 0)) == f"{flashmla.ENV}={tmp_path / 'nowhere'} is not a directory"
    monkeypatch.setenv(flashmla.ENV, str(tmp_path))
    assert "not a FlashMLA checkout with its cutlass submodule (no csrc/params.h" in flashmla.unavailable()
    _fake_checkout(tmp_path)
    assert flashmla.unavailable("cpu") == "flashmla runs on CUDA (sm_90) only"
    if torch.cuda.is_available():
        assert "sm_90 only" in flashmla.unavailable("cuda", (8, 9))
    else:
        assert flashmla.unavailable("cuda", (9, 0)) == "flashmla needs CUDA, and torch sees no GPU"


def test_library_key_covers_the_checkout_and_not_what_is_not_compiled(tmp_path):
    root = _fake_checkout(tmp_path / "FlashMLA")
    key = lambda: flashmla.library(root).path()  # noqa: E731
    first = key()
    assert first.name.startswith("verify_attn_flashmla-") and key() == first
    (root / "csrc/sm100/unused.cuh").parent.mkdir(parents=True)
    (root / "csrc/sm100/unused.cuh").write_text("// sm100: not compiled\n")
    assert key() == first
    (root / "csrc/params.h").write_text("// changed\n")  # a header of csrc/
    second = key()
    assert second != first
    (root / "csrc/cutlass/include/cutlass/new.h").write_text("// a file more in cutlass\n")
    assert key() != second
    lib = flashmla.library(root)
    assert lib.arch == "9.0a" and "--use_fast_math" in lib.cuda_flags and "-std=c++20" in lib.cxx_flags
    assert lib.sources[0] == flashmla.BINDING and set(lib.sources[1:]) == set(flashmla.SOURCES)
    assert b'#include "sm90/decode/dense/instantiations/bf16.cu"' in lib.files["flashmla_sm90_bf16.cu"]


def test_a_second_library_builds_once_and_then_loads_from_the_cache(tmp_path):
    """build.Library: the main extension's cache, lock and atomic write for another library."""
    source = tmp_path / "toy.cpp"
    source.write_text('#include <ATen/ATen.h>\n#include <torch/library.h>\n'
                      'at::Tensor twice(const at::Tensor& x) { return x * 2; }\n'
                      'TORCH_LIBRARY(verify_attn_toy, m) { m.def("twice(Tensor x) -> Tensor"); }\n'
                      'TORCH_LIBRARY_IMPL(verify_attn_toy, CPU, m) { m.impl("twice", &twice); }\n')
    code = ("import sys, time, torch; from pathlib import Path; from verify_attn import build; "
            "lib = build.Library('verify_attn_toy', {'toy.cpp': Path(sys.argv[1]).read_bytes()}, ('toy.cpp',)); "
            "t = time.perf_counter(); p = build.load_library(lib); s = time.perf_counter() - t; "
            "assert torch.ops.verify_attn_toy.twice(torch.ones(2)).tolist() == [2.0, 2.0]; print(p); print(s)")
    env = dict(os.environ, VERIFY_ATTN_CACHE=str(tmp_path / "cache"), VERIFY_ATTN_CPU_ONLY="1")
    runs = [subprocess.run([sys.executable, "-c", code, str(source)], cwd=ROOT, env=env, check=True,
                           capture_output=True, text=True).stdout.split() for _ in range(2)]
    assert runs[0][0] == runs[1][0] and Path(runs[0][0]).is_file() and float(runs[1][1]) < 1.0
    assert Path(runs[0][0]).parent == tmp_path / "cache" / "lib"


def test_pages_view_the_cache_in_place():
    kv = torch.randn(3, 128, 576).bfloat16()
    view, table = flashmla.pages(kv)
    assert view.shape == (6, 64, 1, 576) and view.data_ptr() == kv.data_ptr()
    assert table.dtype == torch.int32 and table.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert torch.equal(view[int(table[2, 1]), :, 0], kv[2, 64:])


def test_pages_past_the_storage_are_refused_and_slack_is_used():
    with pytest.raises(ValueError, match="storage ends before row 1088"):
        flashmla.pages(torch.randn(1, 1041, 576).bfloat16())
    with pytest.raises(ValueError, match="must be a multiple of 64"):
        flashmla.pages(torch.randn(2, 1041, 576).bfloat16())
    padded = torch.randn(2, 1088, 576).bfloat16()
    view, table = flashmla.pages(padded[:, :1041])  # the rows past 1041 exist: read in place
    assert table.tolist() == [list(range(17)), list(range(17, 34))]
    assert torch.equal(view[int(table[1, 16]), :17, 0], padded[1, 1024:1041])


def test_paged_input_is_a_value_error(no_checkout):
    inputs = cases.make_inputs(cases.CASES["paged_2x16x17"])
    with pytest.raises(ValueError, match="contiguous cache only"):
        flashmla.run(inputs.q, inputs.kv, inputs.kv_indices, inputs.parent, inputs.prefix_lens, inputs.scale,
                     None, None)


# The GPU part: only where a FlashMLA checkout is named and this is an sm_90 GPU.
gpu = pytest.mark.skipif(flashmla.unavailable() is not None, reason=str(flashmla.unavailable()))

CHAIN_CASES = [
    cases.Case("fm_1x16x17x1024", 1, 16, 17, (1024,), tree="chain", pad_to=64),
    cases.Case("fm_2x64x9_ragged", 2, 64, 9, (2048, 700), tree="chain", pad_to=64),
    cases.Case("fm_3x8x65_ragged", 3, 8, 65, (4096, 0, 777), tree="chain", pad_to=64),
    cases.Case("fm_1x64x33x16384", 1, 64, 33, (16384,), tree="chain", pad_to=64),
    cases.Case("fm_1x16x9_flashmla_scale", 1, 16, 9, (700,), tree="chain", pad_to=64, scale=576 ** -0.5),
    cases.Case("fm_1x8x1x100", 1, 8, 1, (100,), tree="chain", pad_to=64),
]


@gpu
@pytest.mark.parametrize("case", CHAIN_CASES, ids=lambda c: c.name)
def test_flashmla_matches_reference_on_chains(case):
    inputs = cases.make_inputs(case, "cuda", 5)
    assert inputs.kv.shape[1] % 64 == 0
    err = check(Candidate("flashmla"), inputs)
    assert err.ok, err


@gpu
def test_host_list_and_tensor_prefixes_agree():
    case = CHAIN_CASES[1]
    inputs = cases.make_inputs(case, "cuda", 7)
    results = []
    for prefix in (inputs.prefix_lens, inputs.prefix_lens.tolist(), inputs.prefix_lens.tolist()):  # 3rd: cached
        out = torch.empty(case.batch, case.q_len, case.heads, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(case.batch, case.heads, case.q_len, dtype=torch.float32, device="cuda")
        flashmla.run(inputs.q, inputs.kv, None, inputs.parent, prefix, inputs.scale, out, lse)
        results.append((out, lse))
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


@gpu
def test_an_unpadded_cache_is_a_value_error_not_a_read_past_it():
    inputs = cases.make_inputs(cases.Case("fm_1x16x17x1041", 1, 16, 17, (1024,), tree="chain"), "cuda", 1)
    err = check(Candidate("flashmla"), inputs)
    assert not err.ok and "64-token pages" in err.reason
