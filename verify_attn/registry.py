"""The implementations: one entry each, read by the binding, the build, the resource report,
the suite, the check, the plots and the tests.

Adding a compiled implementation NAME takes its launcher (``plan_NAME`` and ``launch_NAME``
in a CUDA source, ``NAME_cpu`` in a C++ source where it has a CPU twin; the contract is in
kernels/verify_attn.h) and one ``Impl`` in ``IMPLS``. The build generates the torch op
``torch.ops.verify_attn.NAME`` from the entry.

A kernel with several paths (tc: wgmma or its transposed form on compute capability 9.0,
mma.sync everywhere else)
lets its plan choose the path for the GPU; every other path it has is an entry of its own
(``variant_of`` the kernel, ``path`` pinned), so it is gated, timed and recorded as a name
wherever it runs, not only on the GPUs whose best path it is.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    doc: str
    cuda_sources: tuple[str, ...] = ()  # kernels/ files defining plan_<symbol> and launch_<symbol>
    cpu_sources: tuple[str, ...] = ()   # kernels/ files defining <symbol>_cpu; () = no CPU twin
    symbol: str = ""                    # the C++ name; default: name
    runner: str = ""                    # "module:function" for an implementation in Python
    trees: str = "any"                  # "any" or "chain" (causal masks only)
    paged: bool = True                  # takes one-token pages through kv_indices
    kv_multiple: int = 1                # contiguous kv rows per element must be a multiple of this
    max_q_len: int = 0                  # the longest tree it takes (0: any)
    min_arch: int = 0                   # lowest CUDA compute capability, e.g. 80 for mma.sync
    arch_family: tuple[int, ...] = ()   # only these capabilities' major versions, e.g. (9,)
    tolerance: str = "default"          # key of verify_attn.accuracy.TOLERANCE
    color: str = ""                     # plots; default: from the entry's position
    baseline: bool = False              # the implementation speedups are taken over
    under_test: bool = True             # a kernel of this project (False: a peer timed beside them)
    available: str = ""                 # "module:function" (device, capability) -> why not here, or None:
                                        # an optional peer's own conditions (imported when asked)
    paths: tuple[str, ...] = ()         # the kernel's paths by number (Plan::path), where it has several
    path: int = -1                      # the path its plan must take; -1 (kAnyPath): the plan chooses
    variant_of: str = ""                # the entry whose kernel this runs on a pinned path

    def path_name(self, number: int) -> str:
        return self.paths[number] if 0 <= number < len(self.paths) else str(number)

    @property
    def cpp(self) -> str:
        return self.symbol or self.name

    @property
    def compiled(self) -> bool:
        return bool(self.cuda_sources or self.cpu_sources)

    def devices(self) -> tuple[str, ...]:
        if self.runner:
            return ("cpu", "cuda")
        return (("cpu",) if self.cpu_sources else ()) + (("cuda",) if self.cuda_sources else ())

    def unsupported(self, device: str, capability: tuple[int, int] | None = None) -> str | None:
        """Why this implementation cannot run on the device, or None when it can."""
        if device not in self.devices():
            return f"{self.name} has no {device} implementation"
        if device == "cuda" and capability is not None:
            cc = capability[0] * 10 + capability[1]
            if cc < self.min_arch:
                return f"{self.name} needs compute capability {self.min_arch / 10:.1f} or newer, this GPU is {cc / 10:.1f}"
            if self.arch_family and capability[0] not in self.arch_family:
                return f"{self.name} runs on sm_{'/'.join(str(a) for a in self.arch_family)}x only, this GPU is sm_{cc}"
        if self.available:
            module, name = self.available.split(":")
            return getattr(importlib.import_module(module), name)(device, capability)
        return None

    def rejects(self, chain: bool, paged: bool, kv_cols: int = 0, q_len: int = 1) -> str | None:
        """Why this implementation does not take a case of this shape, or None."""
        if self.trees == "chain" and not chain:
            return f"{self.name} takes chain trees only (causal masks)"
        if paged and not self.paged:
            return f"{self.name} does not take one-token pages"
        if kv_cols % self.kv_multiple:
            return f"{self.name} reads kv in pages of {self.kv_multiple} rows: {kv_cols} rows a batch element is not a multiple"
        if self.max_q_len and q_len > self.max_q_len:
            return f"{self.name} takes q_len <= {self.max_q_len}, this case has {q_len}"
        return None

    def function(self) -> Callable:
        module, name = self.runner.split(":")
        return getattr(importlib.import_module(module), name)


# tc's paths by Plan::path number (kernels/tc.cu).
TC_PATHS = ("mma", "wgmma", "wgmma_t", "wgmma_ws", "wgmma_tma", "mma_mid", "mma_small")
# tc's files: the plan and launch first (plan_tc, launch_tc), then each path's kernels, compiled
# in parallel (kernels/tc_host.h).
TC_SOURCES = ("tc.cu", "tc_mma.cu", "tc_wgmma.cu", "tc_wgmma_t.cu", "tc_wgmma_ws.cu", "tc_wgmma_tma.cu")

_ENTRIES = [
    Impl("naive", "the baseline written the obvious way: scores in a global workspace, softmax, output",
         cuda_sources=("naive.cu",), cpu_sources=("cpu.cpp",), color="tab:gray", baseline=True),
    Impl("flash", "CUDA cores in fp32: one head a block, a warp per key, KV split and merged by lse",
         cuda_sources=("flash.cu",), cpu_sources=("cpu.cpp",), color="tab:blue"),
    Impl("tc", "tensor cores (bf16, fp32 accumulation): a cache tile shared by every head and tree row; "
         "on compute capability 9.0 two MMA warpgroups on alternate tiles (beside a copy warpgroup, or "
         "for a contiguous cache each refilling by TMA what it frees; wgmma where every "
         "element's keys fit in two tiles), mma.sync elsewhere",
         cuda_sources=TC_SOURCES, min_arch=80, tolerance="rounded_weights", color="tab:green", paths=TC_PATHS),
    Impl("tc_mma", "tc pinned to its portable mma.sync path (what every GPU but the H100/H200 runs)",
         cuda_sources=TC_SOURCES, symbol="tc", min_arch=80, tolerance="rounded_weights", color="tab:olive",
         paths=TC_PATHS, path=0, variant_of="tc"),
    # The portable path in the configurations of smaller parts (kernels/tc_host.h): a GPU with
    # 227 KB a block runs tc_mma as CfgLarge, which no part under it can hold, so these two gate
    # what an A100 and an sm_89/sm_120 card run (verify_attn.grid.GATED_ONLY: checked, not timed).
    Impl("tc_mma_mid", "tc's mma.sync path in an A100's configuration (163 KB of shared memory a block: 32-key "
         "tiles, 2 stages)", cuda_sources=TC_SOURCES, symbol="tc", min_arch=80, tolerance="rounded_weights",
         color="olivedrab", paths=TC_PATHS, path=5, variant_of="tc"),
    Impl("tc_mma_small", "tc's mma.sync path in an sm_89 or sm_120 card's configuration (99 KB a block: "
         "16-key tiles, 1 stage)", cuda_sources=TC_SOURCES, symbol="tc", min_arch=80,
         tolerance="rounded_weights", color="darkkhaki", paths=TC_PATHS, path=6, variant_of="tc"),
    # tc's sm_90a paths pinned (kernels/tc.cu says where the plan takes which): tc_wgmma is
    # gated on every named case, not timed at Quick's long prefixes (verify_attn.grid.GATED_ONLY);
    # tc_wgmma_t (never planned: slower) is checked (`check --impl all`, the parity tests).
    Impl("tc_wgmma", "tc pinned to its wgmma path, both warpgroups in one phase, 64 query rows on M",
         cuda_sources=TC_SOURCES, symbol="tc", min_arch=90, arch_family=(9,), tolerance="rounded_weights",
         color="tab:purple", paths=TC_PATHS, path=1, variant_of="tc"),
    Impl("tc_wgmma_t", "tc pinned to its transposed wgmma path, keys on M and query rows on N "
         "(slower than wgmma at few rows on the H200)",
         cuda_sources=TC_SOURCES, symbol="tc", min_arch=90, arch_family=(9,), tolerance="rounded_weights",
         color="tab:cyan", paths=TC_PATHS, path=2, variant_of="tc", under_test=False),
    # The plan's paths on compute capability 9.0: pinned, each times tc's own kernel again where
    # the plan takes it, so neither is timed in Quick (under_test=False); `check --impl all`
    # reaches both by name. wgmma_tma takes what its plan branch does (kernels/tc.cu).
    Impl("tc_wgmma_ws", "tc pinned to its warp-specialized wgmma path: a cp.async producer warpgroup and two "
         "consumer warpgroups on alternate tiles (what tc runs on the H100/H200 for paged caches and trees "
         "over 65 tokens)",
         cuda_sources=TC_SOURCES, symbol="tc", min_arch=90, arch_family=(9,), tolerance="rounded_weights",
         color="tab:brown", paths=TC_PATHS, path=3, variant_of="tc", under_test=False),
    Impl("tc_wgmma_tma", "tc pinned to its wgmma path without a copy warpgroup: two consumer warpgroups on "
         "alternate tiles, each refilling by TMA what it frees (what tc runs on the H100/H200 for a contiguous "
         "cache and trees of up to 65 tokens)",
         cuda_sources=TC_SOURCES, symbol="tc", min_arch=90, arch_family=(9,), tolerance="rounded_weights",
         color="tab:pink", paths=TC_PATHS, path=4, variant_of="tc", under_test=False, paged=False, max_q_len=65),
    Impl("torch", "the plain torch composite a careful user would write instead",
         runner="verify_attn.ops:torch_composite", tolerance="rounded_weights", color="tab:orange",
         under_test=False),
    Impl("flashmla", "DeepSeek's FlashMLA (Hopper wgmma+TMA, 64-token pages, causal masks only): the reference line",
         runner="verify_attn.flashmla:run", available="verify_attn.flashmla:unavailable", trees="chain",
         paged=False, kv_multiple=64, arch_family=(9,), tolerance="rounded_weights", color="tab:red",
         under_test=False),
]
IMPLS: dict[str, Impl] = {i.name: i for i in _ENTRIES}


def register(impl: Impl) -> None:
    """Add an implementation (an optional peer, or a test's). Before the extension is built:
    compiled entries become ops only in a build that starts after this."""
    if impl.name in IMPLS and IMPLS[impl.name] != impl:
        raise ValueError(f"an implementation named {impl.name!r} is already registered")
    IMPLS[impl.name] = impl


def get(name: str) -> Impl:
    try:
        return IMPLS[name]
    except KeyError:
        raise ValueError(f"impl must be one of {tuple(IMPLS)}, got {name!r}") from None


def names() -> tuple[str, ...]:
    return tuple(IMPLS)


def under_test() -> tuple[str, ...]:
    return tuple(n for n, i in IMPLS.items() if i.under_test)


def display_order(device: str) -> tuple[str, ...]:
    """Every implementation in the order the asv classes list it. asv's graph page opens on
    the first value of each parameter, so first come the kernels under test that have a
    backend on this device, newest (registered last) first, then their pinned-path variants,
    the baseline, the peers, and last those with no backend here."""
    order = list(IMPLS)

    def rank(name: str) -> tuple:
        i = IMPLS[name]
        kernel = i.under_test and not i.baseline
        return (device not in i.devices(), not kernel, bool(i.variant_of), not i.under_test,
                -order.index(name) if kernel and not i.variant_of else order.index(name))

    return tuple(sorted(order, key=rank))


def baseline() -> str:
    return next(i.name for i in IMPLS.values() if i.baseline)


def color(name: str) -> str:
    impl = IMPLS.get(name)
    if impl and impl.color:
        return impl.color
    return f"C{(list(IMPLS).index(name) if name in IMPLS else len(IMPLS)) % 10}"
