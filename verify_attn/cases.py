"""Named cases: shapes, trees and layouts shared by the check, the tests and the benchmarks,
plus bundles (a case's inputs in a file) so that captured inputs can be replayed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .shapes import KEY_DIM, LATENT

# torch is imported by the functions that make tensors: the benchmark modules read CASES in
# asv's fork server, which must not hold torch (verify_attn/gpu.py says why).

# DeepSeek-V3: 1/sqrt(192) times the YaRN mscale**2 (docs/op.md).
DEEPSEEK_V3_SCALE = 0.1352
BUNDLE_FORMAT = "verify_attn.bundle/1"
TREES = ("chain", "random", "star")
MAGNITUDES = ("unit", "mla")


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
    pad_to: int = 1      # kv_cols rounded up to a multiple of this (FlashMLA's pages: 64)
    magnitude: str = "mla"  # the inputs' distribution: see make_inputs

    @property
    def kv_len(self) -> int:
        """Rows the longest batch element uses."""
        return max(self.prefix_lens) + self.q_len

    @property
    def kv_cols(self) -> int:
        """Rows per batch element in the tensors (kv_len, padded); the rest go unused."""
        return -(-self.kv_len // self.pad_to) * self.pad_to


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


def make_parent(tree, q_len: int, gen: torch.Generator) -> list[int]:
    """The parent array of a named tree shape, or the given one (a tuple of q_len parents)."""
    import torch

    if isinstance(tree, tuple):
        if len(tree) != q_len:
            raise ValueError(f"a given tree needs q_len = {q_len} parents, got {len(tree)}")
        return list(tree)
    if tree == "chain":
        return [i - 1 for i in range(q_len)]
    if tree == "star":
        return [-1] + [0] * (q_len - 1)
    if tree == "random":  # a random recursive tree: each node hangs off any earlier one
        return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, q_len)]
    raise ValueError(f"tree must be one of {TREES}, got {tree!r}")


def make_inputs(case: Case, device="cpu", seed: int = 0) -> Inputs:
    """Fresh random inputs for a case, bf16, never exactly zero.

    Magnitudes ("unit": everything standard normal; "mla", the default: like a real MLA
    model's absorbed queries and latent cache). In DeepSeek-style MLA the cache row is the
    output of an RMSNorm (unit RMS times a learned per-channel gain, a few channels well
    above 1) and the absorbed query is q_nope times W_UK, several times larger than unit.
    So "mla" draws the cache's latent columns N(0, 1) times a per-channel gain ~ LogNormal(0,
    0.5) (fixed per seed), its rope columns N(0, 1), and queries N(0, 2^2). At DeepSeek-V3's
    scale 0.1352 a score then has a standard deviation of about 8, and max |score| reaches
    the tens (about 40 over a thousand keys): large enough that rounding scores to bf16, as a
    careless composite does, fails the tolerance.

    The large tensors are drawn on the target device (seeded: the same seed gives the same
    inputs on the same device), the tree and the page table on the CPU. A paged case scatters
    each element's rows over a pool a quarter larger than the rows used, in random order, and
    points the unused slots of the index table at random rows of the pool."""
    import torch

    if case.magnitude not in MAGNITUDES:
        raise ValueError(f"magnitude must be one of {MAGNITUDES}, got {case.magnitude!r}")
    gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    mla = case.magnitude == "mla"
    gain = torch.ones(KEY_DIM, device=device)
    if mla:
        gain[:LATENT] = torch.exp(0.5 * torch.randn(LATENT, generator=dev_gen, device=device))

    def normal(*shape, std=1.0):
        return (torch.randn(shape, generator=dev_gen, device=device) * std).to(torch.bfloat16)

    q = normal(case.batch, case.q_len, case.heads, KEY_DIM, std=2.0 if mla else 1.0)
    parent = torch.tensor([make_parent(case.tree, case.q_len, gen) for _ in range(case.batch)], dtype=torch.int32)
    prefix_lens = torch.tensor(case.prefix_lens, dtype=torch.int32)
    kv_indices = None
    if case.paged:
        used = [p + case.q_len for p in case.prefix_lens]
        rows = sum(used) * 5 // 4 + 1
        order = torch.randperm(rows, generator=gen)
        kv_indices = torch.randint(0, rows, (case.batch, case.kv_cols), generator=gen, dtype=torch.int32)
        start = 0
        for b, n in enumerate(used):
            kv_indices[b, :n] = order[start:start + n]
            start += n
        kv = normal(rows, KEY_DIM, std=gain)
    else:
        kv = normal(case.batch, case.kv_cols, KEY_DIM, std=gain)
    return Inputs(q, kv, parent, prefix_lens, case.scale, kv_indices).to(device)


def grid_case(heads: int, q_len: int, prefix_len: int, batch: int = 1, tree: str = "random",
              pad_to: int = 1) -> Case:
    """A benchmark grid point: batch elements of one prefix length, contiguous."""
    name = f"h{heads}_q{q_len}_p{prefix_len}" + (f"_{tree}" if tree != "random" else "")
    return Case(name, batch, heads, q_len, (prefix_len,) * batch, tree,
                large=prefix_len * heads * q_len > 2**22, pad_to=pad_to)


def serving_prefixes(batch: int, shortest: int = 1024, longest: int = 65536) -> tuple[int, ...]:
    """Ragged prefixes as a serving batch has them: spread geometrically from shortest to
    longest, in a fixed shuffled order (not sorted, so no kernel gets a tidy batch)."""
    import torch

    if batch == 1:
        return (longest,)
    spread = [round(shortest * (longest / shortest) ** (k / (batch - 1))) for k in range(batch)]
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(batch)).tolist()
    return tuple(spread[k] for k in order)


def serving_case(batch: int, heads: int, q_len: int, tree: str = "random", paged: bool = True,
                 pad_to: int = 1) -> Case:
    """A serving step: a batch of verification trees with ragged prefixes; by default random
    trees in a paged pool of one-token pages with shuffled rows (a chain tree in a contiguous
    cache padded to 64 rows is the form FlashMLA reads)."""
    name = f"serving_b{batch}_h{heads}_q{q_len}" + (f"_{tree}" if tree != "random" else "")
    return Case(name, batch, heads, q_len, serving_prefixes(batch), tree, paged=paged, large=True, pad_to=pad_to)


def _named() -> dict[str, Case]:
    cases = [
        # The seed's parity cases, (batch, heads, q_len, kv_len) as named.
        Case("seed_2x16x17x2065", 2, 16, 17, (2048, 2048)),
        Case("seed_1x64x33x161", 1, 64, 33, (128,)),
        Case("seed_2x64x9x521", 2, 64, 9, (512, 512)),
        Case("seed_2x8x9x9", 2, 8, 9, (0, 0)),
        Case("chain_1x16x17x1041", 1, 16, 17, (1024,), tree="chain", pad_to=64),  # FlashMLA's pages
        Case("star_1x16x33x2081", 1, 16, 33, (2048,), tree="star"),
        Case("random_3x8x65x4161", 3, 8, 65, (4096, 4096, 4096)),
        Case("ragged_3x16x9", 3, 16, 9, (5000, 0, 777)),
        Case("prefix0_1x64x65", 1, 64, 65, (0,)),
        Case("paged_2x16x17", 2, 16, 17, (3000, 1234), paged=True),
        Case("paged_ragged_2x64x9", 2, 64, 9, (4096, 15), paged=True, tree="chain"),
        Case("q1_1x8x1x100", 1, 8, 1, (100,)),
        Case("scale_flashmla_1x16x9", 1, 16, 9, (700,), scale=576 ** -0.5),
        # Realistic magnitudes at the extremes: unit-normal inputs, and the tree of the report
        # that caught the bf16-rounding composite (max |score| about 40 here).
        Case("unit_2x16x9x1033", 2, 16, 9, (1024, 300), magnitude="unit"),
        Case("mla_1x16x9x1009", 1, 16, 9, (1000,), tree=(-1, 0, 0, 1, 1, 2, 3, 4, 5)),
        Case("mla_paged_2x64x17", 2, 64, 17, (2500, 40), paged=True),
        # 24 query rows an element: one group of 32 rows, 8 of them padding (tc's wgmma_t at 16
        # rows a warpgroup, which no other case reaches), paged and ragged.
        Case("rows24_2x8x3x317", 2, 8, 3, (314, 17), paged=True),
        # Few rows and a long prefix not a multiple of 64: few blocks share the keys, so each
        # split holds many tiles and ends mid-tile (the splits of the cases above hold <= 2).
        Case("long_1x8x9x30011", 1, 8, 9, (30002,), large=True),
        Case("big_1x64x9x65545", 1, 64, 9, (65536,), large=True),
        Case("big_1x64x33x65569", 1, 64, 33, (65536,), large=True),
    ]
    return {c.name: c for c in cases}


CASES = _named()


def save_bundle(inputs: Inputs, path: str | Path) -> None:
    """Write a case's inputs to a file that ``load_bundle`` reads back."""
    import torch

    data = dataclasses.asdict(inputs.to("cpu"))
    data = {k: v for k, v in data.items() if v is not None}
    data["scale"] = torch.tensor(inputs.scale, dtype=torch.float64)
    data["format"] = BUNDLE_FORMAT
    torch.save(data, path)


def load_bundle(path: str | Path) -> Inputs:
    """Read a bundle. Only tensors and plain values load (no code runs); a malformed file
    raises ValueError naming the file and what is wrong."""
    import torch

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
