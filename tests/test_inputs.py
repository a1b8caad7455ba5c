"""Bad input raises an error that names the argument and what was expected."""

import pytest
import torch

from conftest import COMPILED
from verify_attn import cases, ops, registry


@pytest.fixture
def good():
    return cases.make_inputs(cases.CASES["paged_2x16x17"])


def call(i, impl="flash", **over):
    args = dict(q=i.q, kv=i.kv, parent=i.parent, prefix_lens=i.prefix_lens, scale=i.scale, kv_indices=i.kv_indices)
    args.update(over)
    return ops.verify_attention(impl=impl, **args)


@pytest.mark.parametrize("impl", registry.names())
@pytest.mark.parametrize("change, message", [
    (lambda i: {"q": i.q.float()}, "q must be BFloat16"),
    (lambda i: {"q": i.q[..., :512].contiguous()}, "q must be [batch, q_len, heads, 576]"),
    (lambda i: {"q": i.q.transpose(1, 2)}, "q must be contiguous"),
    (lambda i: {"kv": i.kv[:, :512].contiguous()}, "kv (paged) must be [rows, 576]"),
    (lambda i: {"kv_indices": i.kv_indices.long()}, "kv_indices must be Int"),
    (lambda i: {"kv_indices": i.kv_indices[:1]}, "kv_indices.shape[0] must be batch"),
    (lambda i: {"parent": i.parent[:, :5].contiguous()}, "parent.shape[1] must be q_len"),
    (lambda i: {"prefix_lens": i.prefix_lens.long()}, "prefix_lens must be Int"),
    (lambda i: {"scale": -1.0}, "scale must be a positive finite number"),
    (lambda i: {"parent": torch.zeros_like(i.parent)}, "parent must be a tree"),
    (lambda i: {"parent": torch.tensor([[-1] + [2] * 16] * 2, dtype=torch.int32)}, "parent[1] = 2"),
    (lambda i: {"prefix_lens": torch.tensor([3000, 99999], dtype=torch.int32)}, "prefix_lens[1] = 99999"),
    (lambda i: {"prefix_lens": torch.tensor([-1, 0], dtype=torch.int32)}, "prefix_lens[0] = -1"),
    (lambda i: {"kv_indices": i.kv_indices.clone().fill_(i.kv.shape[0])}, "kv_indices of batch element 0"),
])
def test_bad_input_names_the_argument(good, impl, change, message):
    with pytest.raises((RuntimeError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        call(good, impl, **change(good))


def test_contiguous_kv_shape_is_checked():
    i = cases.make_inputs(cases.CASES["seed_2x8x9x9"])
    with pytest.raises(ValueError, match=r"kv.shape\[0\] must be batch"):
        call(i, kv=i.kv[:1].contiguous())
    with pytest.raises(ValueError, match="fewer than q_len"):
        call(i, kv=i.kv[:, :5].contiguous(), prefix_lens=torch.zeros(2, dtype=torch.int32))


def test_sizes_beyond_the_kernels_are_refused():
    q = torch.randn(1, 1025, 1, 576).bfloat16()
    kv = torch.randn(1, 1025, 576).bfloat16()
    parent = torch.arange(-1, 1024, dtype=torch.int32)[None]
    with pytest.raises(ValueError, match="q_len = 1025 exceeds the supported maximum of 1024"):
        ops.verify_attention(q, kv, parent, torch.zeros(1, dtype=torch.int32), 0.1)


def test_unknown_impl_is_refused(good):
    with pytest.raises(ValueError, match="impl must be one of"):
        call(good, impl="fast")


@pytest.mark.parametrize("impl", registry.names())
def test_an_impl_that_cannot_run_here_is_a_value_error_naming_it(good, impl):
    """Not the dispatcher's NotImplementedError: the registry's reason, with the name and device."""
    reason = ops.unsupported(impl, good.q.device.type)
    if reason is None:
        pytest.skip(f"{impl} runs on {good.q.device.type}")
    with pytest.raises(ValueError, match=f"impl='{impl}' cannot run on these {good.q.device.type} tensors: "):
        call(good, impl)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mixed_devices_are_refused(good):
    with pytest.raises(ValueError, match="kv must be on cuda"):
        call(good.to("cuda"), kv=good.kv)


def test_raw_op_survives_values_it_does_not_check(good):
    """The raw op skips the value checks (they cost a sync) but must not read out of bounds."""
    out = torch.empty(2, 17, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(2, 16, 17)
    bad_idx = good.kv_indices.clone().fill_(10**9)
    for impl in (n for n in COMPILED if not ops.unsupported(n, "cpu")):
        getattr(torch.ops.verify_attn, impl)(good.q, good.kv, bad_idx, torch.full_like(good.parent, 5),
                                             torch.tensor([10**6, -5], dtype=torch.int32), good.scale, out, lse)


@pytest.mark.parametrize("name", ["q", "kv", "parent", "prefix_lens", "kv_indices", "out", "lse"])
@pytest.mark.parametrize("make", [lambda t: t.tolist(), lambda t: t.float().numpy(), lambda t: 3],
                         ids=["list", "numpy", "int"])
def test_what_is_not_a_tensor_is_a_type_error_naming_it(good, name, make):
    args = dict(q=good.q, kv=good.kv, parent=good.parent, prefix_lens=good.prefix_lens, scale=good.scale,
                kv_indices=good.kv_indices)
    args[name] = make(getattr(good, name) if name not in ("out", "lse") else torch.zeros(2))
    with pytest.raises(TypeError, match=rf"^{name} must be a torch.Tensor, got "):
        ops.verify_attention(**args)


@pytest.mark.parametrize("name", ["q", "kv", "parent", "prefix_lens"])
def test_none_for_a_tensor_is_a_type_error(good, name):
    args = dict(q=good.q, kv=good.kv, parent=good.parent, prefix_lens=good.prefix_lens, scale=good.scale)
    args[name] = None
    with pytest.raises(TypeError, match=rf"^{name} must be a torch.Tensor, got NoneType"):
        ops.verify_attention(**args)


@pytest.mark.parametrize("scale", ["0.1", None, torch.tensor(0.1), True])
def test_scale_must_be_a_number(good, scale):
    with pytest.raises(TypeError, match="scale must be a Python float"):
        call(good, scale=scale)
