"""The stream verb: kernel times of back-to-back calls summarised per kernel (no GPU needed
for the summary; the GPU run itself is `python -m verify_attn stream` on a GPU box)."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verify_attn_tools import stream

ROOT = Path(__file__).resolve().parent.parent
ATTN = "verify_attn::(anonymous namespace)::tc_attn_ws(verify_attn::Params, verify_attn::TcArgs, verify_attn::KvMap)"
MERGE = "void verify_attn::(anonymous namespace)::tc_merge_rows(verify_attn::Params, verify_attn::TcArgs)"
MAIN = "void sm90::flash_fwd_splitkv_mla_kernel<Traits<cutlass::bfloat16_t, 64, 576, 512>, SharedMemoryPlan>(Params)"
COMBINE = "void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 64>(CombineParams)"


def test_cupti_names_are_shortened_as_nsight_computes_are():
    assert stream.short_name(ATTN) == "tc_attn_ws"
    assert stream.short_name(MERGE) == "tc_merge_rows"
    assert stream.short_name(MAIN) == "flash_fwd_splitkv_mla_kernel"
    assert stream.short_name(COMBINE) == "flash_fwd_mla_combine_kernel"


def test_a_kernel_after_another_and_a_grid_that_overlaps_its_predecessor():
    # tc: attention 40 us, the merge 0.5 us after it for 5 us, the next call 1 us later
    tc = []
    for k in range(3):
        t = 46.5 * k
        tc += [(t, t + 40.0, ATTN), (t + 40.5, t + 45.5, MERGE)]
    s = stream.summarise(tc, 3)["kernels"]
    assert [r["name"] for r in s] == ["tc_attn_ws", "tc_merge_rows"]
    assert [r["per_call"] for r in s] == [1, 1]
    assert s[0]["duration"]["median_us"] == pytest.approx(40.0)
    assert s[0]["gap_before"] == {"median_us": pytest.approx(1.0), "min_us": pytest.approx(1.0),
                                  "max_us": pytest.approx(1.0)}  # two gaps: the first call has none
    assert s[1]["gap_before"]["median_us"] == pytest.approx(0.5)
    # FlashMLA: the combine placed 3 us before its main kernel ends reads -3
    fm = [(0.0, 38.0, MAIN), (35.0, 53.0, COMBINE), (54.0, 92.0, MAIN), (89.0, 107.0, COMBINE)]
    s = stream.summarise(fm, 2)["kernels"]
    assert s[1]["gap_before"]["median_us"] == pytest.approx(-3.0)
    assert s[0]["gap_before"]["median_us"] == pytest.approx(1.0)


def test_a_kernel_inside_a_longer_one_does_not_end_the_overlap():
    # A [0, 10] holds B [2, 5] inside it; C starts at 6 while A still runs: -4, not +1 after B
    ks = [(0.0, 10.0, "a()"), (2.0, 5.0, "b()"), (6.0, 12.0, "c()")]
    rows = {r["name"]: r for r in stream.summarise(ks, 1)["kernels"]}
    assert rows["b"]["gap_before"]["median_us"] == pytest.approx(-8.0)
    assert rows["c"]["gap_before"]["median_us"] == pytest.approx(-4.0)


def test_the_exit_says_a_failed_check_before_anything_else(monkeypatch, capsys):
    import verify_attn.ops

    monkeypatch.setattr(stream, "need_gpu", lambda what: None)
    monkeypatch.setattr(verify_attn.ops, "load", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    ran = {"call_us": 46.5, **stream.summarise([(0, 40, ATTN), (40.5, 45.5, MERGE)], 1)}
    failed = {"skipped": "fails its check: 3 elements beyond the tolerance"}
    absent = {"skipped": "FlashMLA is not built"}

    def verb(*outcomes):
        monkeypatch.setattr(stream, "run_point", lambda *a: dict(zip(("tc", "flashmla"), outcomes)))
        return stream.main(["--points", "chain:8:9:65536", "--calls", "2"])

    assert verb(ran, absent) == 0
    assert verb(failed, absent) == 1  # the only one that ran failed: news, not a refusal
    assert verb(failed, ran) == 1
    assert verb(absent, absent) == 2
    assert "nothing ran: every implementation was skipped (FlashMLA is not built)" in capsys.readouterr().err


def test_a_kernel_of_one_call_only_counts_a_fraction_of_a_launch():
    ks = [(0.0, 5.0, "setup_once()"), (6.0, 16.0, ATTN), (17.0, 27.0, ATTN)]
    rows = {r["name"]: r for r in stream.summarise(ks, 2)["kernels"]}
    assert rows["setup_once"]["per_call"] == 0.5 and rows["setup_once"]["gap_before"] is None
    assert rows["tc_attn_ws"]["per_call"] == 1
    with pytest.raises(ValueError, match="calls must be at least 1"):
        stream.summarise(ks, 0)


def test_copies_sets_host_events_and_the_timers_spin_are_not_a_calls_kernels():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, start, end, device=cuda):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [ev(MERGE, 50, 55), ev("at::cuda::(anonymous namespace)::spin_kernel(long)", 0, 9),
              ev("Memcpy HtoD (Pageable -> Device)", 1, 2), ev("Memset (Device)", 2, 3),
              ev("aten::empty", 3, 4, cpu), ev(ATTN, 10, 50)]
    assert stream.kernels_of(events) == [(10.0, 50.0, ATTN), (50.0, 55.0, MERGE)]


def test_the_table_names_the_call_time_once_and_a_skipped_implementation():
    results = {"tc": {"call_us": 46.5, **stream.summarise([(0, 40, ATTN), (40.5, 45.5, MERGE),
                                                           (46.5, 86.5, ATTN), (87, 92, MERGE)], 2)},
               "flashmla": {"skipped": "FlashMLA is not built (VERIFY_ATTN_FLASHMLA unset)"}}
    lines = stream.table("chain h8 q9 p65536", "NVIDIA H100", 2, results).splitlines()
    assert lines[0] == "### chain h8 q9 p65536 (NVIDIA H100; 2 calls back to back, kernels by CUPTI)"
    assert lines[4] == "| tc | 46.50 | tc_attn_ws | 1 | 40.00 (40.00-40.00) | 1.00 (1.00 to 1.00) |"
    assert lines[5] == "|  |  | tc_merge_rows | 1 | 5.00 (5.00-5.00) | 0.50 (0.50 to 0.50) |"
    assert lines[6].startswith("| flashmla | - | skipped: FlashMLA is not built")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the profiler starts")
def test_a_point_is_checked_and_warmed_up_before_the_profiler_which_needs_cuda():
    # CPU: flashmla is skipped (sm_90 only), flash passes its float64 check and goes through
    # the timer's warm-up, then the CUDA profiler refuses to start
    skipped = stream.run_point("chain", (8, 9, 2048), ["flashmla"], 4, "cpu")
    assert list(skipped) == ["flashmla"] and skipped["flashmla"]["skipped"]
    assert not skipped["flashmla"]["skipped"].startswith(stream.FAILED)
    with pytest.raises(stream.Refusal, match="the CUDA profiler did not start"):
        stream.run_point("chain", (8, 9, 2048), ["flash"], 4, "cpu")


def run_verb(*args):
    return subprocess.run([sys.executable, "-m", "verify_attn", "stream", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a box without a GPU gets")
def test_without_a_gpu_the_verb_refuses_in_one_line():
    proc = run_verb("--points", "chain:8:9:65536")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("python -m verify_attn stream: stream needs a CUDA GPU")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_bad_point_or_call_count_is_named():
    proc = run_verb("--points", "chain:8:9")
    assert proc.returncode == 2 and "chain:8:9" in proc.stderr and "SEL:H:Q:P" in proc.stderr
    proc = run_verb("--calls", "1")
    assert proc.returncode == 2 and "--calls" in proc.stderr and "must be in [2, 10000]" in proc.stderr
