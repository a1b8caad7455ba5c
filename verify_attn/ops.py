"""The public entry point: ``verify_attention`` and the implementations it can run.

``torch.ops.verify_attn.<impl>`` are the raw ops (shape checks only, safe in CUDA graphs);
``verify_attention`` also checks the values (tree, prefix lengths, indices), which costs
one host sync and is skipped while a CUDA graph is being captured.
"""

from __future__ import annotations

import contextlib

import torch

from . import build, registry
from .shapes import LATENT

_faked: set[str] = set()


def load() -> None:
    """Load the extension (building it if needed) and register its ops' fake kernels."""
    build.load()
    for name in ["check", *(n for n, i in registry.IMPLS.items() if i.compiled)]:
        if name not in _faked and hasattr(torch.ops.verify_attn, name):
            # The ops only mutate out and lse, so their fake needs do nothing.
            torch.library.register_fake(f"verify_attn::{name}")(lambda *args, **kwargs: None)
            _faked.add(name)


def unsupported(impl: str, device: str) -> str | None:
    """Why impl cannot run on this device here (no such backend, GPU too old, not built), or None."""
    entry = registry.get(impl)
    capability = torch.cuda.get_device_capability() if device == "cuda" and torch.cuda.is_available() else None
    reason = entry.unsupported(device, capability)
    if reason is None and entry.compiled:
        load()
        if not hasattr(torch.ops.verify_attn, impl):
            reason = f"{impl} is not in the loaded extension (registered after it was built)"
    return reason


def launch_plan(impl: str, args, ns: str = "verify_attn") -> dict | None:
    """The launch plan a CUDA implementation uses for these op arguments (its op in namespace
    ns), or None (CPU, Python)."""
    op = getattr(getattr(torch.ops, ns), f"{impl}_plan", None)
    if op is None or not args[0].is_cuda:
        return None
    keys = ("blocks", "threads", "smem_bytes", "num_splits", "split_len", "rows_per_block", "keys_per_tile",
            "workspace_bytes", "path")
    return dict(zip(keys, op(*args)))


def check_types(**args) -> None:
    """Raise TypeError naming the first argument that is not a tensor (kv_indices, out and
    lse may be None)."""
    for name, value in args.items():
        if value is None and name in ("kv_indices", "out", "lse"):
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__module__}.{type(value).__qualname__}"
                            .replace("builtins.", ""))


def check_values(kv: torch.Tensor, kv_indices: torch.Tensor | None, parent: torch.Tensor,
                 prefix_lens: torch.Tensor) -> None:
    """Raise ValueError unless parent is a tree, prefixes fit kv and indices fit the pool."""
    q_len = parent.shape[1]
    kv_cols = kv_indices.shape[1] if kv_indices is not None else kv.shape[1]
    pos = torch.arange(q_len, device=parent.device)
    bad_parent = (parent[:, 0] != -1) | ((parent[:, 1:] < 0) | (parent[:, 1:] >= pos[1:])).any(1)
    bad_prefix = (prefix_lens < 0) | (prefix_lens > kv_cols - q_len)
    flags = [bad_parent, bad_prefix]
    if kv_indices is not None:
        used = torch.arange(kv_cols, device=kv.device)[None, :] < (prefix_lens + q_len)[:, None]
        flags.append((((kv_indices < 0) | (kv_indices >= kv.shape[0])) & used).any(1))
    bad = torch.stack(flags).cpu()  # the one sync
    if bad[0].any():
        b = int(bad[0].nonzero()[0])
        row = parent[b].tolist()
        at = next(i for i, v in enumerate(row) if (i == 0 and v != -1) or (i > 0 and not 0 <= v < i))
        raise ValueError(f"parent must be a tree (parent[b, 0] == -1, 0 <= parent[b, i] < i): "
                         f"batch element {b} has parent[{at}] = {row[at]}")
    if bad[1].any():
        b = int(bad[1].nonzero()[0])
        raise ValueError(f"prefix_lens[{b}] = {int(prefix_lens[b])} must be in [0, {kv_cols - q_len}] "
                         f"(kv holds {kv_cols} rows per batch element, q_len = {q_len})")
    if kv_indices is not None and bad[2].any():
        b = int(bad[2].nonzero()[0])
        raise ValueError(f"kv_indices of batch element {b} must index rows of kv in [0, {kv.shape[0]})")


def validate(q, kv, parent, prefix_lens, scale, kv_indices, out, lse, values: bool = True) -> None:
    """The entry point's checks: shapes and types (the check op), then, unless values=False or a
    CUDA graph is being captured, the values (one host sync)."""
    load()
    torch.ops.verify_attn.check(q, kv, kv_indices, parent, prefix_lens, scale, out, lse)
    if values and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_values(kv, kv_indices, parent, prefix_lens)


def verify_attention(q: torch.Tensor, kv: torch.Tensor, parent: torch.Tensor, prefix_lens: torch.Tensor,
                     scale: float, *, kv_indices: torch.Tensor | None = None, impl: str = "flash",
                     out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                     check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA verify attention of a draft tree against a cached prefix.

    Parameters
    ----------
    q : [batch, q_len, heads, 576] bf16, queries (latent || rope), the tree's nodes
    kv : [batch, kv_len, 576] bf16, or a paged pool [rows, 576] bf16 with ``kv_indices``
    parent : [batch, q_len] int32, parent[b, 0] = -1 and parent[b, i] < i
    prefix_lens : [batch] int32; element b uses kv rows [0, prefix_lens[b] + q_len), the
        last q_len of them being the tree's own rows
    scale : softmax scale
    kv_indices : [batch, kv_len] int32 rows of the pool, one token per page
    impl : a name of ``verify_attn.registry.IMPLS``
    out, lse : optional outputs, [batch, q_len, heads, 512] bf16 and [batch, heads, q_len] fp32
    check : check the values of parent, prefix_lens and kv_indices (one host sync)

    Returns
    -------
    out, lse : the attention output and its log-sum-exp (natural log)
    """
    entry = registry.get(impl)
    check_types(q=q, kv=kv, parent=parent, prefix_lens=prefix_lens, kv_indices=kv_indices, out=out, lse=lse)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
    load()
    batch, q_len, heads = q.shape[:3] if q.dim() == 4 else (0, 0, 0)
    if out is None:
        out = torch.empty((batch, q_len, heads, LATENT), dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device)
    validate(q, kv, parent, prefix_lens, scale, kv_indices, out, lse, check)
    reason = unsupported(impl, q.device.type)
    if reason:  # before the dispatcher, whose error names no implementation or device
        raise ValueError(f"impl={impl!r} cannot run on these {q.device.type} tensors: {reason}")
    if entry.runner:
        entry.function()(q, kv, kv_indices, parent, prefix_lens, scale, out, lse)
    else:
        getattr(torch.ops.verify_attn, impl)(q, kv, kv_indices, parent, prefix_lens, scale, out, lse)
    return out, lse


def tree_mask(parent: torch.Tensor) -> torch.Tensor:
    """[q_len, q_len] bool, [i, j] true when j is i or an ancestor of i (by matrix squaring)."""
    q_len = parent.shape[0]
    eye = torch.eye(q_len, device=parent.device)
    step = torch.zeros_like(eye)
    # scatter_ takes the 1.0 as a kernel argument. Indexed assignment (step[i, j] = 1.0) copies
    # it to the GPU from pageable host memory, which waits for the GPU: a host sync per call
    # that made the composite's timings host-bound and its CUDA graph capture fail.
    step[1:].scatter_(1, parent[1:].long().unsqueeze(1), 1.0)
    reach = eye + step
    for _ in range(max(q_len - 1, 1).bit_length()):
        reach = (reach @ reach).clamp_(max=1.0)
    return reach > 0


@contextlib.contextmanager
def _tf32():
    """TF32 tensor-core matmuls for fp32 operands that hold bf16 values: bf16 fits in TF32's
    10-bit mantissa, so the products are exact and the sums fp32, as in the kernels."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def torch_composite(q, kv, kv_indices, parent, prefix_lens, scale, out, lse) -> None:
    """What a careful user writes with plain torch: scores and softmax in fp32, a masked
    softmax per batch element, the value sum in fp32.

    Honours the NaN contract of docs/op.md: a non-finite score becomes NaN (so a non-finite
    value in q or in an attended row makes that query's out and lse NaN), and the tree rows'
    values enter the sum with their non-finite entries zeroed, since a masked sibling row must
    not reach a query through 0 * NaN; a query that attends such a row is NaN by its score. ``prefix_lens`` may be a
    list: a serving engine knows them on the host, and reading them from a GPU tensor would
    cost a sync per call."""
    q_len = q.shape[1]
    if isinstance(prefix_lens, torch.Tensor):
        prefix_lens = prefix_lens.tolist()
    with _tf32():
        for b, prefix in enumerate(prefix_lens):
            kv_len = prefix + q_len
            rows = kv[kv_indices[b, :kv_len].long()] if kv_indices is not None else kv[b, :kv_len]
            keys = rows.float()
            visible = tree_mask(parent[b])  # [q_len, q_len]
            scores = torch.einsum("ihd,td->hit", q[b].float(), keys) * scale
            # A non-finite score (an inf in q or a row can score -inf) is NaN: weight 0 would hide it.
            scores = torch.nan_to_num(scores, nan=float("nan"), posinf=float("nan"), neginf=float("nan"))
            scores[..., prefix:].masked_fill_(~visible, float("-inf"))
            lse_b = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - lse_b[..., None])
            tree = keys[prefix:, :LATENT]
            o = torch.einsum("hit,td->ihd", probs[..., prefix:], torch.nan_to_num(tree, 0.0, 0.0, 0.0))
            if prefix:
                o += torch.einsum("hit,td->ihd", probs[..., :prefix], keys[:prefix, :LATENT])
            out[b] = o
            lse[b] = lse_b
