"""The cost model (docs/cost-model.md): what the mask lets through, and the roofline.

FLOPs = 2 * heads * sum_i (prefix_len + depth_i) * (576 + 512) per batch element, where
depth_i counts the tree rows query i sees (itself and its ancestors). Fewest bytes: each
cache row read once, queries read once, outputs and lse written once.
"""

from __future__ import annotations

import dataclasses

from .shapes import KEY_DIM, LATENT, ancestors


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes

    def roofline_s(self, peak_flops: float, peak_bytes_per_s: float) -> float:
        """The least time the hardware allows: the larger of the two floors."""
        return max(self.flops / peak_flops, self.bytes / peak_bytes_per_s)


def cost(heads: int, parents: list[list[int]], prefix_lens: list[int]) -> Cost:
    """Cost of one call: parents and prefix_lens per batch element."""
    flops = bytes_ = 0.0
    for parent, prefix in zip(parents, prefix_lens):
        q_len = len(parent)
        seen = sum(prefix + len(ancestors(parent, i)) for i in range(q_len))
        flops += 2.0 * heads * seen * (KEY_DIM + LATENT)
        bytes_ += (prefix + q_len) * KEY_DIM * 2 + heads * q_len * (KEY_DIM * 2 + LATENT * 2 + 4)
    return Cost(flops, bytes_)


def cost_of(inputs) -> Cost:
    """Cost of a verify_attn.cases.Inputs."""
    return cost(inputs.q.shape[2], inputs.parent.tolist(), inputs.prefix_lens.tolist())
