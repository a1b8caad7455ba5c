"""Which device the suite measures on, decided without importing torch.

asv forks every benchmark from a server process that imported the benchmark modules once.
A fork costs about as much as the server's memory: with torch imported 8.8 ms on the H200's
host and 13.5 ms on a 2-core CPU box, without it 1.2 and 0.4 ms (the copy of its mappings and
the child's teardown), and a full suite forks about 7,500 times. So the benchmark modules import nothing that imports torch; torch is imported
by each class's setup_cache, once. This module answers what they need at import time, the
device, as torch.cuda.device_count() would: 0 for a torch built without CUDA (its version
file says so), else NVML's count as CUDA_VISIBLE_DEVICES narrows it. Where that cannot be
read without torch (no nvidia-ml-py, NVML failing, device UUIDs in CUDA_VISIBLE_DEVICES),
torch is asked.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path


def device() -> str:
    """The machine's default device, unless VERIFY_ATTN_DEVICE says otherwise."""
    return os.environ.get("VERIFY_ATTN_DEVICE") or ("cuda" if count() else "cpu")


def torch_cuda() -> bool | None:
    """Whether the installed torch was built with CUDA, from its version file; None: unknown."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^cuda\b[^=\n]*=\s*(\S+)", text, re.M)
    return None if m is None else m.group(1) != "None"


def _nvml_count() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, no driver
        return None


def _visible(total: int, spec: str) -> int | None:
    """How many of total devices CUDA_VISIBLE_DEVICES leaves (torch's reading: the leading
    valid indices); None for device UUIDs, which only torch resolves here."""
    seen = 0
    for item in spec.split(","):
        item = item.strip()
        if item.startswith(("GPU-", "MIG-")):
            return None
        if not re.fullmatch(r"[+-]?\d+", item) or not 0 <= int(item) < total:
            break
        seen += 1
    return seen


def count() -> int:
    """The CUDA devices torch would see."""
    has_cuda = torch_cuda()
    if has_cuda is False:
        return 0
    total = _nvml_count() if has_cuda else None
    if total is not None:
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = total if spec is None else _visible(total, spec)
        if seen is not None:
            return seen
    import torch  # the slow answer: torch's own

    return torch.cuda.device_count()
