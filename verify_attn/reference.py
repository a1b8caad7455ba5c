"""The float64 reference, written from the mask's definition and nothing else."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .shapes import LATENT, ancestors


def mask(parent: list[int], prefix_len: int) -> torch.Tensor:
    """[q_len, prefix_len + q_len] bool: every prefix row, then self and ancestors."""
    q_len = len(parent)
    m = torch.zeros((q_len, prefix_len + q_len), dtype=torch.bool)
    m[:, :prefix_len] = True
    for i in range(q_len):
        for j in ancestors(parent, i):
            m[i, prefix_len + j] = True
    return m


class Reference(NamedTuple):
    out: torch.Tensor      # [batch, q_len, heads, 512]
    lse: torch.Tensor      # [batch, heads, q_len]
    abs_out: torch.Tensor  # [batch, q_len, heads, 512]: sum_t p_t |v_t|, the scale of rounding the p_t


@torch.no_grad()
def reference(q, kv, parent, prefix_lens, scale, kv_indices=None, head_chunk: int = 8) -> Reference:
    """out, lse and abs_out (sum of the weights times |value|: what an error in the weights
    is relative to), all float64. Computed on q's device, a few heads at a time to bound memory.
    """
    batch, q_len, heads, _ = q.shape
    out = torch.empty((batch, q_len, heads, LATENT), dtype=torch.float64, device=q.device)
    abs_out = torch.empty_like(out)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float64, device=q.device)
    for b, prefix in enumerate(prefix_lens.tolist()):
        kv_len = prefix + q_len
        rows = kv[kv_indices[b, :kv_len].long()] if kv_indices is not None else kv[b, :kv_len]
        keys = rows.double()
        allowed = mask(parent[b].tolist(), prefix).to(q.device)
        for h0 in range(0, heads, head_chunk):
            qh = q[b, :, h0:h0 + head_chunk].double()  # q_len x hc x 576
            scores = torch.einsum("ihd,td->hit", qh, keys) * scale
            scores.masked_fill_(~allowed, float("-inf"))
            lse[b, h0:h0 + head_chunk] = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - lse[b, h0:h0 + head_chunk, :, None])
            out[b, :, h0:h0 + head_chunk] = torch.einsum("hit,td->ihd", probs, keys[:, :LATENT])
            abs_out[b, :, h0:h0 + head_chunk] = torch.einsum("hit,td->ihd", probs, keys[:, :LATENT].abs())
    return Reference(out, lse, abs_out)
