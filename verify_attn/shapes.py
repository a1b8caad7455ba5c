"""The op's dimensions and its tree walk: the bottom layer, imported by everything else.

No torch extension here (nothing to build), so the cost model, the cases and the tooling can
use it on any machine.
"""

from __future__ import annotations

LATENT = 512              # latent width of a cache row, also the value width
ROPE = 64                 # rope width
KEY_DIM = LATENT + ROPE   # one cache row: latent || rope
MAX_Q_LEN = 1024          # limits every implementation accepts (kernels/verify_attn.h)
MAX_KV_LEN = 1 << 24


def ancestors(parent: list[int], i: int) -> list[int]:
    """Tree rows query i sees: itself and its ancestors, nearest first."""
    rows = []
    while i >= 0:
        rows.append(i)
        i = parent[i]
    return rows


def is_chain(parent: list[int]) -> bool:
    """Whether the tree is a chain (parent[i] = i - 1): a causal mask over the tree rows."""
    return all(p == i - 1 for i, p in enumerate(parent))
