"""How far an implementation's output is from the float64 reference, and whether that is
close enough.

The outputs are bf16: rounding alone leaves up to 2**-9 relative error per element, and the
fp32 accumulation in a different order adds a little, so an element passes when
``|out - ref| <= 2**-8 * |ref| + atol`` with ``atol = 2**-14 * max|ref|`` for elements that
cancel to near zero. The lse is fp32: it passes within ``1e-4 * (1 + |ref|)``.

"rounded_weights" is for implementations whose value product runs on tensor cores with the
weights rounded: to bf16 in tc and FlashMLA (as in FlashAttention), to TF32 in the torch
composite. Rounding each weight p_t by up to 2**-9 of itself (bf16; TF32: 2**-11) moves an
output element by up to ``2**-9 * sum_t p_t |v_t|`` (abs_out of the reference), which can be
far above ``2**-8 * |out|`` where the values cancel. Such an implementation is allowed
``2**-8 * abs_out`` more, twice the worst case of bf16 rounding alone; a mask or indexing bug
moves an output by a whole weight, well beyond that. The lse tolerance is the same for all.
Any NaN, in particular the NaN poison left where an output was never written, fails.
"""

from __future__ import annotations

import dataclasses

import torch

from . import registry

# (out rtol, out atol as a fraction of max|ref|, lse rtol, out tolerance as a fraction of abs_out)
TOLERANCE = {"default": (2.0**-8, 2.0**-14, 1e-4, 0.0), "rounded_weights": (2.0**-8, 2.0**-14, 1e-4, 2.0**-8)}


@dataclasses.dataclass
class Error:
    max_abs: float
    max_rel: float
    lse_max_abs: float
    ok: bool
    reason: str = ""


def measure(impl: str, out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
            ref_abs: torch.Tensor | None = None) -> Error:
    rtol, atol_frac, lse_rtol, weight_tol = TOLERANCE[registry.get(impl).tolerance]
    out64, lse64 = out.double(), lse.double()
    err = (out64 - ref_out).abs()
    atol = atol_frac * float(ref_out.abs().max())
    if weight_tol:
        atol = atol + weight_tol * ref_abs
    max_abs = float(err.max())
    max_rel = float((err / (ref_out.abs() + atol)).max())
    lse_err = (lse64 - ref_lse).abs()
    lse_max_abs = float(lse_err.max())
    nan = int(torch.isnan(out64).sum()) + int(torch.isnan(lse64).sum())
    if nan:
        return Error(max_abs, max_rel, lse_max_abs, False, f"{nan} NaN or unwritten elements")
    bad = int((err > rtol * ref_out.abs() + atol).sum())
    if bad:
        return Error(max_abs, max_rel, lse_max_abs, False, f"{bad} output elements beyond tolerance")
    bad = int((lse_err > lse_rtol * (1 + ref_lse.abs())).sum())
    if bad:
        return Error(max_abs, max_rel, lse_max_abs, False, f"{bad} lse elements beyond tolerance")
    return Error(max_abs, max_rel, lse_max_abs, True)


def poisoned_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs filled with NaN, so that an element the kernel never writes fails the check."""
    batch, q_len, heads, _ = q.shape
    out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    lse = torch.full((batch, heads, q_len), float("nan"), dtype=torch.float32, device=q.device)
    return out, lse
