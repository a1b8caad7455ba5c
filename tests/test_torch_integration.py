"""The ops behave as torch ops: schema and fakes (opcheck), torch.compile, CUDA graphs."""

import pytest
import torch

from conftest import COMPILED, require
from verify_attn import accuracy, cases, ops


def _args(inputs):
    out, lse = accuracy.poisoned_outputs(inputs.q)
    return (inputs.q, inputs.kv, inputs.kv_indices, inputs.parent, inputs.prefix_lens, inputs.scale, out, lse)


@pytest.mark.parametrize("impl", COMPILED)
def test_opcheck(impl, device):
    require(impl, device)
    inputs = cases.make_inputs(cases.CASES["paged_2x16x17"], device)
    torch.library.opcheck(getattr(torch.ops.verify_attn, impl).default, _args(inputs),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_matches_eager(device):
    inputs = cases.make_inputs(cases.CASES["seed_2x8x9x9"], device)
    eager = _args(inputs)
    torch.ops.verify_attn.flash(*eager)

    @torch.compile(fullgraph=True, backend="eager" if device == "cpu" else "inductor")
    def step(q, kv, parent, prefix_lens, out, lse):
        torch.ops.verify_attn.flash(q, kv, None, parent, prefix_lens, inputs.scale, out, lse)
        return out * 2

    compiled = _args(inputs)
    doubled = step(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, compiled[6], compiled[7])
    assert torch.equal(compiled[6], eager[6]) and torch.equal(compiled[7], eager[7])
    assert torch.equal(doubled, eager[6] * 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("impl", COMPILED)
def test_cuda_graph_replay_matches_eager(impl):
    require(impl, "cuda")
    inputs = cases.make_inputs(cases.CASES["paged_ragged_2x64x9"], "cuda")
    eager = _args(inputs)
    getattr(torch.ops.verify_attn, impl)(*eager)
    graphed = _args(inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graphs asks
        ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale,
                             kv_indices=inputs.kv_indices, impl=impl, out=graphed[6], lse=graphed[7])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the value checks are skipped while capturing
        ops.verify_attention(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale,
                             kv_indices=inputs.kv_indices, impl=impl, out=graphed[6], lse=graphed[7])
    graphed[6].fill_(float("nan"))
    graphed[7].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graphed[6], eager[6]) and torch.equal(graphed[7], eager[7])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_torch_composite_has_no_host_sync():
    """With prefix lengths on the host (as the benchmarks pass them) the composite must not
    wait for the GPU: a CUDA graph capture fails on any host sync or pageable copy."""
    inputs = cases.make_inputs(cases.CASES["paged_ragged_2x64x9"], "cuda")
    prefixes = inputs.prefix_lens.tolist()
    eager = _args(inputs)
    ops.torch_composite(*eager[:4], prefixes, *eager[5:])
    graphed = _args(inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.torch_composite(*graphed[:4], prefixes, *graphed[5:])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.torch_composite(*graphed[:4], prefixes, *graphed[5:])
    graphed[6].fill_(float("nan"))
    graphed[7].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    # cuBLAS may pick another algorithm inside a graph: equal up to bf16 rounding
    torch.testing.assert_close(graphed[6], eager[6], rtol=2**-7, atol=2**-7 * float(eager[6].abs().max()))
    torch.testing.assert_close(graphed[7], eager[7], rtol=1e-4, atol=1e-4)
