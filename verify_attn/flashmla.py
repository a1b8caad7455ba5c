"""FlashMLA as an optional peer: DeepSeek's Hopper MLA decode kernel, timed beside ours.

Nothing of FlashMLA is part of this repository. Point ``$VERIFY_ATTN_FLASHMLA`` at a FlashMLA
checkout (github.com/deepseek-ai/FlashMLA, with its ``csrc/cutlass`` submodule; only
``csrc/`` minus sm100 and ``csrc/cutlass/include`` are read) and the registry's ``flashmla``
runs; without it every consumer skips it with the reason ``unavailable`` gives.

What is built: FlashMLA's decode scheduler, its combine kernel and its sm90 dense bf16
split-KV decode, with FlashMLA's own nvcc flags for sm_90a, plus our binding
(kernels/flashmla_binding.cpp), as a second library through verify_attn.build's
content-addressed cache (keyed by those sources, every header of csrc/ outside cutlass,
cutlass's version.h and file list, the flags, torch and CUDA). About two minutes the first
time; a later process with the same checkout loads it from the cache.

What it takes (``run``): chain trees (FlashMLA's causal mask: query i sees the prefix and
tree rows 0..i), a contiguous cache ``kv [batch, kv_cols, 576]`` read in place as FlashMLA's
64-token pages. FlashMLA reads whole pages, so the rows up to the next multiple of 64 past
each element's kv_len must exist in kv's storage: kv_cols a multiple of 64 (the suite's
chain cases: ``Case(pad_to=64)``), or, for batch 1, storage extending that far. Any other
kv is a ValueError (a copy into pages would be timed with it). Rows past kv_len inside the
last page are loaded and masked: they must hold finite values (the cases' padding rows do),
because FlashMLA multiplies them by a zero probability.

The scheduler's metadata (FlashMLA's ``get_mla_metadata``) depends only on the sequence
lengths and the shapes; FlashMLA makes it once per decoding step and shares it between the
layers. Here it is made once per (prefix lengths, q_len, heads) when the prefix lengths
come as a host list (as the suite times every runner), and per call when they come as a
tensor.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import OrderedDict
from pathlib import Path

import torch

from . import build

ENV = "VERIFY_ATTN_FLASHMLA"
PAGE = 64          # FlashMLA's page_block_size, the only one it takes
ARCH = "9.0a"      # TORCH_CUDA_ARCH_LIST: sm_90a (wgmma, TMA)
LIBRARY = "verify_attn_flashmla"
BINDING = "flashmla_binding.cpp"
# Staged wrapper -> the checkout's source (under csrc/) it compiles, in place: FlashMLA's
# sources include their headers by paths relative to themselves.
SOURCES = {
    "flashmla_sched.cu": "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "flashmla_combine.cu": "smxx/decode/combine/combine.cu",
    "flashmla_sm90_bf16.cu": "sm90/decode/dense/instantiations/bf16.cu",
}
INCLUDE_DIRS = ("csrc", "csrc/kerutils/include", "csrc/sm90", "csrc/cutlass/include")
NEEDED = ("csrc/params.h", "csrc/cutlass/include/cutlass/version.h", "csrc/cutlass/include/cute/tensor.hpp",
          "csrc/kerutils/include/kerutils/kerutils.cuh", *(f"csrc/{s}" for s in SOURCES.values()))
_DEFINES = ("-O3", "-std=c++20", "-DNDEBUG", "-DFLASH_MLA_DISABLE_FP16", "-Wno-deprecated-declarations")
CXX_FLAGS = _DEFINES
# FlashMLA's setup.py nvcc flags (its -U's undo torch's half/bf16 operator bans), sm_90a only.
CUDA_FLAGS = _DEFINES + ("-D_USE_MATH_DEFINES", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                         "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                         "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo")

_loaded: Path | None = None
_tables: dict = {}
_schedules: OrderedDict = OrderedDict()
_SCHEDULES_KEPT = 256


def checkout() -> Path | None:
    """The FlashMLA checkout named by $VERIFY_ATTN_FLASHMLA, or None."""
    value = os.environ.get(ENV, "").strip()
    return Path(value).expanduser().resolve() if value else None


def _missing(root: Path) -> list[str]:
    return [n for n in NEEDED if not (root / n).is_file()]


def unavailable(device: str = "cuda", capability: tuple[int, int] | None = None) -> str | None:
    """Why flashmla cannot run here (one line), or None. Builds nothing."""
    root = checkout()
    if root is None:
        return f"set {ENV} to a FlashMLA checkout to time it"
    if not root.is_dir():
        return f"{ENV}={root} is not a directory"
    missing = _missing(root)
    if missing:
        return (f"{ENV}={root} is not a FlashMLA checkout with its cutlass submodule "
                f"(no {missing[0]}: git submodule update --init csrc/cutlass?)")
    if device != "cuda":
        return "flashmla runs on CUDA (sm_90) only"
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "flashmla needs CUDA, and torch sees no GPU"
    capability = capability or torch.cuda.get_device_capability()
    if tuple(capability) != (9, 0):
        return f"flashmla runs on sm_90 only (FlashMLA's dense decode), this GPU is sm_{capability[0]}{capability[1]}"
    return None


def _cuda_include_dirs() -> list[str]:
    """CUDA 13 keeps cub/thrust/libcu++ (which cutlass includes) under include/cccl."""
    from torch.utils.cpp_extension import CUDA_HOME

    cccl = Path(CUDA_HOME or "/usr/local/cuda") / "include" / "cccl"
    return [str(cccl)] if cccl.is_dir() else []


def _stand_in(root: Path) -> bytes:
    """What the build reads from the checkout in place, cheaply: every file of csrc/ outside
    cutlass (sources and headers, small) by content, and cutlass by its version.h and its
    list of include files with their sizes."""
    h = hashlib.sha256()
    csrc = root / "csrc"
    ours = [csrc / n for n in os.listdir(csrc) if n not in ("cutlass", "sm100")]  # sm100: not compiled
    files = [p for top in ours for p in ([top] if top.is_file() else top.rglob("*")) if p.is_file()]
    for path in sorted(files):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    cutlass = csrc / "cutlass" / "include"
    h.update((cutlass / "cutlass" / "version.h").read_bytes())
    for path in sorted(cutlass.rglob("*")):
        if path.is_file():
            h.update(f"{path.relative_to(cutlass)}:{path.stat().st_size}\n".encode())
    return h.digest()


def library(root: Path | None = None) -> build.Library:
    """The build of FlashMLA's decode from the checkout plus our binding."""
    root = root or checkout()
    if root is None:
        raise RuntimeError(unavailable())
    stand_in = _stand_in(root)
    tag = stand_in.hex()[:16]
    files = {BINDING: (build.kernels_dir() / BINDING).read_bytes()}
    for name, path in SOURCES.items():
        # The digest in the text recompiles a wrapper whenever the checkout changes.
        files[name] = f'// FlashMLA csrc/{path} (checkout digest {tag})\n#include "{path}"\n'.encode()
    includes = tuple(str(root / d) for d in INCLUDE_DIRS) + tuple(_cuda_include_dirs())
    return build.Library(LIBRARY, files, (BINDING, *SOURCES), includes, CXX_FLAGS, CUDA_FLAGS, ARCH, stand_in)


def load(verbose: bool = False) -> Path:
    """Build (once per checkout, cached by content) and load the ops; raise RuntimeError when unavailable."""
    global _loaded
    if _loaded is None:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        lib = library()
        if not lib.path().exists():
            print(f"[verify_attn] building FlashMLA's decode from {checkout()} for sm_90a (about two minutes, "
                  f"once: cached in {lib.path().parent})", file=sys.stderr, flush=True)
        _loaded = build.load_library(lib, verbose)
    return _loaded


def pages(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [batch, kv_cols, 576] seen in place as FlashMLA's pages [n, 64, 1, 576], and the
    block table [batch, ceil(kv_cols / 64)] int32 (cached per layout). ValueError when the
    pages of an element would not start at its row 0 or would run past kv's storage."""
    if kv.dim() != 3:
        raise ValueError(f"flashmla takes a contiguous cache kv [batch, kv_len, 576], got {kv.dim()} dimensions")
    batch, kv_cols, dim = kv.shape
    if kv.stride(2) != 1 or kv.stride(1) != dim:
        raise ValueError("flashmla needs the rows of kv contiguous (kv.stride() == (*, 576, 1))")
    page = PAGE * dim
    per_element = -(-kv_cols // PAGE)
    if batch > 1 and kv.stride(0) % page:
        raise ValueError(f"flashmla reads the cache as 64-token pages: kv_len ({kv_cols} rows per batch element) "
                         f"must be a multiple of 64 (allocate it padded: verify_attn.cases.Case(pad_to=64))")
    stride = kv.stride(0) // page if batch > 1 else per_element
    try:
        view = kv.as_strided(((batch - 1) * stride + per_element, PAGE, 1, dim), (page, dim, dim, 1))
    except RuntimeError:  # the last page would run past the storage
        raise ValueError(f"flashmla reads whole 64-token pages: kv holds {kv_cols} rows per batch element, and "
                         f"its storage ends before row {per_element * PAGE} of the last one; make kv_len a multiple "
                         f"of 64 (allocate it padded: verify_attn.cases.Case(pad_to=64))") from None
    key = (kv.device, batch, per_element, stride)
    table = _tables.get(key)
    if table is None:
        table = (torch.arange(per_element, device=kv.device, dtype=torch.int32)[None, :]
                 + stride * torch.arange(batch, device=kv.device, dtype=torch.int32)[:, None]).contiguous()
        _tables[key] = table
    return view, table


def schedule(prefix_lens, q_len: int, heads: int, device: torch.device):
    """(cache_seqlens, tile_scheduler_metadata, num_splits): kept per host list of prefix
    lengths (no host sync after the first call), made afresh for a tensor."""
    if isinstance(prefix_lens, torch.Tensor):
        seqlens = (prefix_lens.to(device=device, dtype=torch.int32) + q_len).contiguous()
        return (seqlens, *torch.ops.verify_attn_flashmla.sched(seqlens, q_len, heads))
    key = (device, tuple(int(p) for p in prefix_lens), q_len, heads)
    hit = _schedules.get(key)
    if hit is None:
        seqlens = torch.tensor([p + q_len for p in key[1]], dtype=torch.int32, device=device)
        hit = (seqlens, *torch.ops.verify_attn_flashmla.sched(seqlens, q_len, heads))
        _schedules[key] = hit
        while len(_schedules) > _SCHEDULES_KEPT:
            _schedules.popitem(last=False)
    else:
        _schedules.move_to_end(key)
    return hit


def run(q, kv, kv_indices, parent, prefix_lens, scale, out, lse) -> None:
    """The registry's runner (ops.torch_composite's arguments). parent is not read: the
    registry entry admits chain trees only, and a chain is FlashMLA's causal mask."""
    if kv_indices is not None:
        raise ValueError("flashmla takes a contiguous cache only: one-token pages (kv_indices) are not its "
                         "64-token pages")
    if not q.is_cuda:
        raise ValueError("flashmla runs on CUDA (sm_90) only")
    load()
    batch, q_len, heads, _ = q.shape
    k_pages, table = pages(kv)
    seqlens, meta, splits = schedule(prefix_lens, q_len, heads, q.device)
    target = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    torch.ops.verify_attn_flashmla.decode(q.contiguous(), k_pages, table, seqlens, meta, splits, float(scale),
                                          target, lse)
    if target is not out:
        out.copy_(target)
