"""The machine's ceilings, against which fractions of peak are computed.

A known GPU uses the figures measured on it once (docs/h200.md), so that every commit's
fraction of peak is computed against the same numbers. Any other device, the CPU included,
has its ceilings measured the first time they are asked for and kept in the build cache
(``peaks-<name>.json``): re-measured per run, a loaded machine's ceilings would move and
read as changes of every kernel. Either way the figures used are recorded with the results
(benchmarks: Machine.track_*).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import torch


@dataclasses.dataclass(frozen=True)
class Peaks:
    device: str
    flops: float           # the matrix rate a kernel could reach (bf16 tensor cores on a GPU)
    fp32_flops: float      # plain fp32 rate, the ceiling of CUDA-core kernels
    bytes_per_s: float     # device memory, read + write
    source: str            # "table" or "measured"


# Measured on the project's H200 on 2026-11-30: 8192^3 matmuls and a device-to-device copy.
KNOWN = {
    "NVIDIA H200": Peaks("NVIDIA H200", 784e12, 50.7e12, 4.17e12, "table"),
}


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


def peaks(device: str) -> Peaks:
    """The ceilings of this device: the table's, else those measured once here and kept."""
    name = device_name(device)
    if name in KNOWN:
        return KNOWN[name]
    from .build import cache_dir

    path = cache_dir() / f"peaks-{asv_machine_name(device)}.json"
    try:
        return Peaks(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    found = measure(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(found)))
    os.replace(tmp, path)
    return found


def _rate(fn, work: float, device: str, reps: int = 5) -> float:
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return work / best


def measure(device: str) -> Peaks:
    """Measure the ceilings: a large copy and square matmuls (random data, never zeros)."""
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32 = _rate(lambda: a @ b, 2.0 * n**3, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    if device == "cuda":
        ah, bh = a.bfloat16(), b.bfloat16()
        matrix = _rate(lambda: ah @ bh, 2.0 * n**3, device)
    else:
        matrix = fp32
    elems = (1 << 28) if device == "cuda" else (1 << 25)
    src = torch.randn(elems, device=device)
    dst = torch.empty_like(src)
    bw = _rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, device)
    return Peaks(device_name(device), matrix, fp32, bw, "measured")


def asv_machine_name(device: str) -> str:
    """The asv machine name: the GPU's name (nvidia-h200), or cpu-<arch> with no GPU."""
    if device == "cuda":
        return torch.cuda.get_device_name().lower().replace(" ", "-")
    import platform

    return f"cpu-{platform.machine()}"



def gpu_details(index: int = 0) -> dict[str, float]:
    """What a GPU's timings depend on besides the code, as numbers asv can keep (NVML): the
    driver (580.95.05 -> 580.95), the CUDA torch was built with, the SM count, the highest SM
    and memory clocks, the application SM clock (what a locked clock would show) and the power
    limit. Empty without NVML or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, no driver
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        major, minor = (driver.split(".") + ["0"])[:2]
        return {
            "driver": float(f"{int(major)}.{int(minor)}"),
            "cuda": float(torch.version.cuda) if torch.version.cuda else float("nan"),
            "sms": float(torch.cuda.get_device_properties(index).multi_processor_count),
            "max_sm_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            "max_mem_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            "app_sm_clock_mhz": float(pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_SM)),
            "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
        }
    finally:
        pynvml.nvmlShutdown()
