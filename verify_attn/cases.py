"""Named cases: shapes, trees and layouts shared by the check, the tests and the benchmarks,
plus bundles (a case's inputs in a file) so that captured inputs can be replayed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from .shapes import KEY_DIM

# DeepSeek-V3: 1/sqrt(192) times the YaRN mscale**2 (docs/op.md).
DEEPSEEK_V3_SCALE = 0.1352
BUNDLE_FORMAT = "verify_attn.bundle/1"
TREES = ("chain", "random", "star")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    batch: int
    heads: int
    q_len: int
    prefix_lens: tuple[int, ...]  # one per batch element
    tree: str = "random"
    paged: bool = False
    scale: float = DEEPSEEK_V3_SCALE
    large: bool = False  # too slow for the CPU backend by default

    @property
    def kv_len(self) -> int:
        return max(self.prefix_lens) + self.q_len


@dataclasses.dataclass
class Inputs:
    """Arguments of verify_attention, in its order."""

    q: torch.Tensor
    kv: torch.Tensor
    parent: torch.Tensor
    prefix_lens: torch.Tensor
    scale: float
    kv_indices: torch.Tensor | None = None

    @property
    def shape(self) -> dict:
        batch, q_len, heads, _ = self.q.shape
        kv_len = (self.kv_indices if self.kv_indices is not None else self.kv).shape[1]
        return {"batch": batch, "heads": heads, "q_len": q_len, "kv_len": kv_len}

    def to(self, device) -> "Inputs":
        move = lambda t: None if t is None else t.to(device)
        return Inputs(move(self.q), move(self.kv), move(self.parent), move(self.prefix_lens), self.scale,
                      move(self.kv_indices))


def make_parent(tree: str, q_len: int, gen: torch.Generator) -> list[int]:
    if tree == "chain":
        return [i - 1 for i in range(q_len)]
    if tree == "star":
        return [-1] + [0] * (q_len - 1)
    if tree == "random":  # a random recursive tree: each node hangs off any earlier one
        return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q_len)]
    raise ValueError(f"tree must be one of {TREES}, got {tree!r}")


def make_inputs(case: Case, device="cpu", seed: int = 0) -> Inputs:
    """Fresh random inputs (standard normal bf16: no zeros) for a case."""
    gen = torch.Generator().manual_seed(seed)
    kv_len = case.kv_len
    q = torch.randn((case.batch, case.q_len, case.heads, KEY_DIM), generator=gen).to(torch.bfloat16)
    parent = torch.tensor([make_parent(case.tree, case.q_len, gen) for _ in range(case.batch)], dtype=torch.int32)
    prefix_lens = torch.tensor(case.prefix_lens, dtype=torch.int32)
    kv_indices = None
    if case.paged:  # one token per page, rows scattered over a pool with unused rows
        rows = case.batch * kv_len * 5 // 4 + 1
        kv = torch.randn((rows, KEY_DIM), generator=gen).to(torch.bfloat16)
        kv_indices = torch.randperm(rows, generator=gen)[: case.batch * kv_len].view(case.batch, kv_len).int()
    else:
        kv = torch.randn((case.batch, kv_len, KEY_DIM), generator=gen).to(torch.bfloat16)
    return Inputs(q, kv, parent, prefix_lens, case.scale, kv_indices).to(device)


def grid_case(heads: int, q_len: int, prefix_len: int, batch: int = 1, tree: str = "random") -> Case:
    """A benchmark grid point."""
    return Case(f"h{heads}_q{q_len}_p{prefix_len}", batch, heads, q_len, (prefix_len,) * batch, tree,
                large=prefix_len * heads * q_len > 2**22)


def _named() -> dict[str, Case]:
    cases = [
        # The seed's parity cases, (batch, heads, q_len, kv_len) as named.
        Case("seed_2x16x17x2065", 2, 16, 17, (2048, 2048)),
        Case("seed_1x64x33x161", 1, 64, 33, (128,)),
        Case("seed_2x64x9x521", 2, 64, 9, (512, 512)),
        Case("seed_2x8x9x9", 2, 8, 9, (0, 0)),
        Case("chain_1x16x17x1041", 1, 16, 17, (1024,), tree="chain"),
        Case("star_1x16x33x2081", 1, 16, 33, (2048,), tree="star"),
        Case("random_3x8x65x4161", 3, 8, 65, (4096, 4096, 4096)),
        Case("ragged_3x16x9", 3, 16, 9, (5000, 0, 777)),
        Case("prefix0_1x64x65", 1, 64, 65, (0,)),
        Case("paged_2x16x17", 2, 16, 17, (3000, 1234), paged=True),
        Case("paged_ragged_2x64x9", 2, 64, 9, (4096, 15), paged=True, tree="chain"),
        Case("q1_1x8x1x100", 1, 8, 1, (100,)),
        Case("scale_flashmla_1x16x9", 1, 16, 9, (700,), scale=576 ** -0.5),
        Case("big_1x64x9x65545", 1, 64, 9, (65536,), large=True),
        Case("big_1x64x33x65569", 1, 64, 33, (65536,), large=True),
    ]
    return {c.name: c for c in cases}


CASES = _named()


def save_bundle(inputs: Inputs, path: str | Path) -> None:
    """Write a case's inputs to a file that ``load_bundle`` reads back."""
    data = dataclasses.asdict(inputs.to("cpu"))
    data = {k: v for k, v in data.items() if v is not None}
    data["scale"] = torch.tensor(inputs.scale, dtype=torch.float64)
    data["format"] = BUNDLE_FORMAT
    torch.save(data, path)


def load_bundle(path: str | Path) -> Inputs:
    """Read a bundle. Only tensors and plain values load (no code runs); a malformed file
    raises ValueError naming the file and what is wrong."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unreadable, truncated, or holding objects other than tensors
        raise ValueError(f"{path}: not a verify_attn bundle ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path}: not a verify_attn bundle (expected a dict with format {BUNDLE_FORMAT!r})")
    want = {"q": torch.bfloat16, "kv": torch.bfloat16, "parent": torch.int32, "prefix_lens": torch.int32,
            "scale": torch.float64}
    for key, dtype in want.items():
        if not isinstance(data.get(key), torch.Tensor):
            raise ValueError(f"{path}: bundle lacks tensor {key!r}")
        if data[key].dtype != dtype:
            raise ValueError(f"{path}: {key} must be {dtype}, got {data[key].dtype}")
    indices = data.get("kv_indices")
    if indices is not None and (not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32):
        raise ValueError(f"{path}: kv_indices must be an int32 tensor")
    if data["scale"].numel() != 1:
        raise ValueError(f"{path}: scale must be a single number")
    return Inputs(data["q"], data["kv"], data["parent"], data["prefix_lens"], float(data["scale"]), indices)
