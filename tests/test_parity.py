"""Every kernel matches the float64 reference on every named case, on fresh random inputs,
with outputs poisoned first so an unwritten element fails."""

import random

import pytest
import torch

from conftest import require
from verify_attn import accuracy, cases, ops, registry
from verify_attn.candidate import Candidate, check, op_args
from verify_attn_tools.check import main as check_main

SMALL = [c for c in cases.CASES.values() if not c.large]


@pytest.mark.parametrize("impl", registry.names())
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_impl_matches_reference(case, impl, device):
    seed = random.randrange(2**31)
    inputs = cases.make_inputs(case, device, seed)
    require(impl, device, inputs)
    err = check(Candidate(impl), inputs)
    assert err.ok, f"seed {seed}: {err}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="prefix 65,536 runs on the GPU")
@pytest.mark.parametrize("impl", registry.under_test())
def test_prefix_65536_matches_reference(impl):
    inputs = cases.make_inputs(cases.CASES["big_1x64x33x65569"], "cuda", 3)
    require(impl, "cuda", inputs)
    err = check(Candidate(impl), inputs)
    assert err.ok, err


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="tc's sm_90a paths run on compute capability 9.0 alone")
@pytest.mark.parametrize("impl", ["tc_wgmma_ws", "tc_wgmma_t", "tc_wgmma_tma"])
@pytest.mark.parametrize("case", [cases.CASES["big_1x64x9x65545"], cases.CASES["big_1x64x33x65569"],
                                  cases.Case("tree300_1x4x300x1300", 1, 4, 300, (1000,)),
                                  cases.Case("unsplit_2x16x9x300", 2, 16, 9, (291, 100))], ids=lambda c: c.name)
def test_pinned_sm90a_paths_match_reference_at_length(case, impl):
    """The pinned paths outside the kernels under test reach the small cases by name
    (test_impl_matches_reference) and these the rest: prefix 65,536 (9 m-groups x 14 splits of
    ~37 pairs of tiles) and a tree of 300 tokens (19 groups of 16 tokens, 6 splits of 3 or 4
    tiles: the top splits are masked tiles throughout, so wgmma_ws's producer cleans masked
    tiles after waiting on a stage's release, j >= 2), and two elements that fit the SMs unsplit
    (6 blocks: wgmma_tma's one-range kernel over a batch, element 1's prefix tile by TMA)."""
    inputs = cases.make_inputs(case, "cuda", 5)
    require(impl, "cuda", inputs)
    err = check(Candidate(impl), inputs)
    assert err.ok, err


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="tc takes its wgmma paths only on compute capability 9.0")
def test_each_tc_path_is_planned_once_and_named():
    """On the H100/H200 tc's plan picks wgmma_tma (256 threads: two consumers that refill by
    TMA) for a contiguous cache whose keys may exceed two tiles where it pays (heads 64 x q_len
    33 at prefix 128: 33 m-groups; heads 64 x q_len 9 at prefix 512, two elements: dealt),
    wgmma_ws (384 threads: a producer warpgroup beside the two consumers) for pages (two
    elements, heads 16 x q_len 17), a tree of 64 tokens or more (three elements, heads 8 x
    q_len 65) and one element of three m-groups (heads 16 x q_len 9), and wgmma where every element's keys fit in two tiles (heads 8 x q_len 9 at prefix
    0: 2 groups of 48 rows, 9 keys); each pinned variant (tc_mma, tc_wgmma, tc_wgmma_t,
    tc_wgmma_ws, and tc_wgmma_tma where it takes the case; tc_mma_mid and tc_mma_small in a
    smaller part's shared memory) runs its own path at every shape, and the plan says which ran."""
    plans = {}
    short, many, one, paged = "seed_2x8x9x9", "seed_2x64x9x521", "seed_1x64x33x161", "paged_2x16x17"
    tall, few = "random_3x8x65x4161", "mla_1x16x9x1009"
    for case in (short, many, one, paged, tall, few):
        inputs = cases.make_inputs(cases.CASES[case], "cuda", 0)
        args = op_args(inputs, *accuracy.poisoned_outputs(inputs.q))
        for impl in ("tc", "tc_mma", "tc_wgmma", "tc_wgmma_t", "tc_wgmma_ws", "tc_wgmma_tma", "tc_mma_mid", "tc_mma_small"):
            if Candidate(impl).skip_reason(inputs) is None:
                plan = ops.launch_plan(impl, args)
                plans[case, impl] = (registry.get(impl).path_name(plan["path"]), plan)
    assert plans[short, "tc"][0] == "wgmma" and plans[short, "tc"][1] == plans[short, "tc_wgmma"][1]
    assert plans[short, "tc"][1]["rows_per_block"] == 48
    for case in (many, one):
        assert plans[case, "tc"][0] == "wgmma_tma" and plans[case, "tc"][1]["threads"] == 256
        assert plans[case, "tc"][1] == plans[case, "tc_wgmma_tma"][1]
    assert plans[paged, "tc"][0] == "wgmma_ws" and plans[paged, "tc"][1]["threads"] == 384
    assert plans[paged, "tc"][1] == plans[paged, "tc_wgmma_ws"][1]
    assert (paged, "tc_wgmma_tma") not in plans  # pages: rejected
    for case in (tall, few):  # path 4 could run, the plan's rule keeps path 3
        assert plans[case, "tc"][0] == "wgmma_ws" and plans[case, "tc"][1] == plans[case, "tc_wgmma_ws"][1]
        assert plans[case, "tc_wgmma_tma"][0] == "wgmma_tma"
    for case in (short, many, one, paged):
        assert plans[case, "tc_mma"][0] == "mma"
        assert plans[case, "tc_wgmma"][0] == "wgmma"
        assert plans[case, "tc_wgmma_t"][0] == "wgmma_t"
        assert plans[case, "tc_wgmma_ws"][0] == "wgmma_ws" and plans[case, "tc_wgmma_ws"][1]["threads"] == 384
        smem = {plans[case, impl][1]["smem_bytes"] for impl in ("tc_mma", "tc_wgmma", "tc_wgmma_t", "tc_wgmma_ws")}
        assert len(smem) == 4  # four kernels: their layouts differ
        # the smaller parts' configurations, planned from their shared memory (kernels/tc_host.h)
        for impl, name, optin in (("tc_mma_mid", "mma_mid", 166912), ("tc_mma_small", "mma_small", 101376)):
            assert plans[case, impl][0] == name and plans[case, impl][1]["smem_bytes"] <= optin
            assert plans[case, impl][1]["smem_bytes"] < plans[case, "tc_mma"][1]["smem_bytes"]


def test_unwritten_output_fails_the_check():
    inputs = cases.make_inputs(cases.CASES["seed_2x8x9x9"])
    out, lse = accuracy.poisoned_outputs(inputs.q)
    ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, out=out, lse=lse)
    from verify_attn.reference import reference
    ref = reference(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale)
    assert accuracy.measure("flash", out, lse, *ref).ok
    out[1, 3, 2, 100] = float("nan")  # as if the kernel had skipped it
    assert not accuracy.measure("flash", out, lse, *ref).ok
    out[1, 3, 2, 100] = ref.out[1, 3, 2, 100]
    big = tuple(int(i) for i in torch.nonzero(ref.out.abs() == ref.out.abs().max())[0])
    out[big] = ref.out[big] * 1.02  # 2% off the largest element: beyond bf16 rounding
    assert not accuracy.measure("flash", out, lse, *ref).ok


def test_mask_is_the_tree():
    """A query must not see a sibling: changing a sibling's row leaves its output alone."""
    case = cases.Case("t", 1, 8, 3, (50,), tree="star")  # 1 and 2 are both children of 0
    inputs = cases.make_inputs(case)
    out1, _ = ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale)
    inputs.kv[0, 50 + 2] = torch.randn(576).bfloat16()  # tree row of query 2
    out2, _ = ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale)
    assert torch.equal(out1[0, :2], out2[0, :2])
    assert not torch.equal(out1[0, 2], out2[0, 2])


def test_check_cli_prints_a_line_per_case_and_impl(capsys):
    assert check_main(["--device", "cpu", "--case", "seed_2x8x9x9", "--case", "paged_2x16x17"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if not l.startswith("#")]
    lines = [l for l in lines if not l.startswith("SKIP")]
    assert len(lines) == 2 * len([n for n in registry.under_test() if not ops.unsupported(n, "cpu")])
    assert all(l.startswith("PASS") for l in lines)
    assert "batch=2 heads=8 q_len=9 kv_len=9" in lines[0] and "max_rel=" in lines[0]
