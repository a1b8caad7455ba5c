"""Static resources of each kernel from the compiler's own report, no GPU needed.

Each CUDA source of the build (verify_attn.build.spec, with the build's own nvcc flags) is
compiled on its own for each architecture; ptxas -v gives registers, static shared memory,
stack and spills, and the PTX's ``.maxntid`` (from ``__launch_bounds__``) gives the block
size, from which the occupancy follows. Dynamic shared memory is not in the compiler's
report: the launch plan records it (benchmarks' track_plan_smem_bytes). Results are cached
by content under the build cache.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from . import registry

# build (which imports torch) is imported where used: the resource benchmark's module is
# imported by asv's fork server, which must not hold torch (verify_attn/gpu.py says why).

# The H100/H200, then the parts that run tc's portable path: an A100 (tc_mma_mid's configuration)
# and an sm_120 card (tc_mma_small's).
ARCHS = ("sm_90", "sm_80", "sm_120")
# What the build compiles for each (verify_attn.build.target): sm_90 parts get sm_90a code.
BUILT_AS = {"sm_90": "sm_90a"}

# Per-SM limits (CUDA programming guide, compute capability table).
LIMITS = {
    "sm_80": {"regs": 65536, "threads": 2048, "blocks": 32, "smem": 164 * 1024, "reserved_smem": 1024},
    "sm_90": {"regs": 65536, "threads": 2048, "blocks": 32, "smem": 228 * 1024, "reserved_smem": 1024},
    "sm_120": {"regs": 65536, "threads": 1536, "blocks": 32, "smem": 100 * 1024, "reserved_smem": 1024},
}


def nvcc() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    raise RuntimeError("nvcc not found: put CUDA's bin on PATH or set CUDA_HOME")


def ptxas() -> str:
    """The ptxas beside nvcc."""
    return str(Path(nvcc()).with_name("ptxas"))


def _short(mangled: str) -> str:
    """The last name of an Itanium nested name: _ZN11verify_attn...11flash_splitE... -> flash_split;
    a template's integer arguments follow it (tc_attn<2,4,2,2,2,1>), so instances stay apart."""
    if not mangled.startswith("_ZN"):
        return mangled
    i, parts = 3, []
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        parts.append(mangled[j:j + int(mangled[i:j])])
        i = j + int(mangled[i:j])
    if not parts:
        return mangled
    args = re.findall(r"L[a-z](\d+)E", mangled[i:]) if mangled[i:i + 1] == "I" else []
    return parts[-1] + (f"<{','.join(args)}>" if args else "")


def occupancy(arch: str, threads: int, regs: int, smem: int) -> int:
    """Resident blocks per SM allowed by threads, registers (per-warp granularity 256) and shared memory."""
    lim = LIMITS[arch]
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = lim["regs"] // (regs_per_warp * warps)
    by_threads = lim["threads"] // (warps * 32)
    by_smem = lim["blocks"] if smem == 0 else lim["smem"] // (smem + lim["reserved_smem"])
    return max(0, min(by_regs, by_threads, by_smem, lim["blocks"]))


def _stubs(ptx: str) -> set[str]:
    """The entries whose body is a trap and nothing else: a kernel compiled out for this
    architecture (tc's sm_90a paths elsewhere), which has no resources worth reporting."""
    out = set()
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\(.*?\)[^{]*\{(.*?)\n\}", ptx, re.S):
        body = [ln.strip() for ln in m.group(2).splitlines()]
        if [ln for ln in body if ln and not ln.startswith(("//", ".loc"))] == ["trap;", "ret;"]:
            out.add(m.group(1))
    return out


def _compile(path: Path, arch: str, build_flags: tuple[str, ...]) -> dict:
    flags = ["-std=c++17", *build_flags, f"-arch={BUILT_AS.get(arch, arch)}", "-I", str(path.parent)]
    ptx = subprocess.run([nvcc(), *flags, "-ptx", "-o", "-", str(path)], check=True, capture_output=True, text=True).stdout
    threads = {}
    for m in re.finditer(r"\.entry\s+(\S+?)\s*\(.*?\)\s*(\.maxntid\s+(\d+))?", ptx, re.S):
        threads[m.group(1)] = int(m.group(3)) if m.group(3) else None
    # ptxas on that PTX: the report `nvcc -c -Xptxas -v` prints, without a second front end.
    rep = subprocess.run([ptxas(), f"-arch={BUILT_AS.get(arch, arch)}", "-v", "-o", os.devnull, "-"],
                         input=ptx, check=True, capture_output=True, text=True).stderr
    kernels, current = {}, None
    for line in rep.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'|Function properties for (\S+)", line)
        if m:
            current = m.group(1) or m.group(2)
            kernels.setdefault(current, {"stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0})
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            kernels[current].update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            kernels[current]["registers"] = int(m[1])
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s[1]) if s else 0
    out, stubs = {}, _stubs(ptx)
    for mangled, k in kernels.items():
        if "registers" not in k or mangled not in threads or mangled in stubs:
            continue
        k["threads"] = threads[mangled] or 1024
        k["blocks_per_sm"] = occupancy(arch, k["threads"], k["registers"], k["smem"])
        k["occupancy"] = k["blocks_per_sm"] * k["threads"] / LIMITS[arch]["threads"]
        out[_short(mangled)] = k
    return out


REPORT_FORMAT = b"2"  # what _compile keeps (2: compiled-out kernels left out); in the cache key


def cache_path(spec=None) -> Path:
    """Where report() keeps its result: keyed by the architectures and their limits, the CUDA
    flags and every kernel file's content (spec: the build's CUDA spec, when the caller has it)."""
    from . import build

    spec = spec or build.spec(cuda=True)
    src = build.kernels_dir()
    files = [src / n for n in spec.kernel_sources] + [src / n for n in build.headers(src)]
    targets = json.dumps([ARCHS, BUILT_AS, LIMITS, spec.cuda_flags]).encode()
    key = hashlib.sha256(REPORT_FORMAT + targets +
                         b"".join(str(f.relative_to(src)).encode() + f.read_bytes() for f in files)).hexdigest()[:20]
    return build.cache_dir() / "resources" / f"{key}.json"


def report() -> dict:
    """{arch: {file: {kernel: {registers, smem, stack, spill_stores, spill_loads, threads,
    blocks_per_sm, occupancy}}}} for every CUDA source of the build, the kernels a source
    compiles out for an architecture (a trap) left out. One process compiles at
    a time (the lock beside the cached file): the suite starts this beside its builds
    (verify_attn.prebuild), and the resource benchmark then waits for it instead of compiling again."""
    from . import build

    spec = build.spec(cuda=True)
    cached = cache_path(spec)
    if cached.exists():
        return json.loads(cached.read_text())
    with build._locked(cached.with_suffix("")):
        if cached.exists():
            return json.loads(cached.read_text())
        src = build.kernels_dir()
        # One nvcc per (architecture, source), all at once: tc's sources set the time.
        jobs = [(arch, name) for arch in ARCHS for name in spec.kernel_sources]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
            done = dict(zip(jobs, pool.map(lambda job: _compile(src / job[1], job[0], spec.cuda_flags), jobs)))
        result = {arch: {name: done[arch, name] for name in spec.kernel_sources} for arch in ARCHS}
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, cached)
    return result


def of_impl(rep: dict, impl: str, arch: str) -> dict:
    """{kernel: figures} of one implementation's CUDA sources on one architecture."""
    out = {}
    for name in registry.get(impl).cuda_sources:
        out.update(rep.get(arch, {}).get(name, {}))
    return out
