"""An implementation is its launcher plus one registry entry: everything else picks it up.

A subprocess (the extension is built from the registry, so a new entry needs a fresh
process) registers two entries and nothing else: a copy of naive under another name with
both backends, and a CUDA-only copy. The build, the ops, the suite, the check, the asv
benchmark parameters, the resource report and the plots must all see them; the CUDA-only
one is skipped on the CPU with its reason shown.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import os, pathlib, shutil, torch
from verify_attn import registry
# The one edit a new implementation needs besides its launcher (here: naive's own):
registry.register(registry.Impl("naive_twin", "naive again", cuda_sources=("naive.cu",), cpu_sources=("cpu.cpp",),
                                symbol="naive"))
registry.register(registry.Impl("naive_gpu", "naive, CUDA only", cuda_sources=("naive.cu",), symbol="naive"))

from verify_attn import build, ops, resources, suite
from verify_attn_tools import plots
from verify_attn_tools.check import main as check_main

ops.load()
assert hasattr(torch.ops.verify_attn, "naive_twin") and hasattr(torch.ops.verify_attn, "naive_gpu")
assert "impls_cuda.cpp" in build.spec(cuda=True).generated
assert 'm.impl("naive_twin"' in build.spec(cuda=True).generated["impls_cuda.cpp"]

grid = suite.measure_grid(None, "full")
twin = grid["results"][(8, 9, 2048, "naive_twin")]
assert twin["ok"] and len(twin["samples"]) == 7 and twin["flops"] > 0, twin
gpu = grid["results"][(8, 9, 2048, "naive_gpu")]
assert gpu["skipped"] == "naive_gpu has no cpu implementation", gpu

import benchmarks.common
assert {"naive_twin", "naive_gpu"} <= set(benchmarks.common.GridBenchmark.params[2])
assert benchmarks.common.IMPLS[0] == "naive_twin"  # asv's graph pages open on the newest kernel here
import benchmarks.bench_resources
assert {"naive_twin", "naive_gpu"} <= set(benchmarks.bench_resources.Resources.params[0])

assert check_main(["--device", "cpu", "--impl", "naive_twin", "--impl", "naive_gpu", "--case", "seed_2x8x9x9"]) == 0

if shutil.which("nvcc"):
    rep = resources.report()
    assert set(resources.of_impl(rep, "naive_twin", "sm_90")) == {"naive_scores", "naive_softmax", "naive_output"}

key = "bench_verify_attn.Heads8.track_time_vs_roofline"
values = {key: {(9, p, i): 10.0 for p in (0, 2048) for i in ("naive", "naive_twin")}}
drawn = plots.plot_peak_fraction([plots.Run("a" * 40, 1, values)], pathlib.Path(os.environ["OUT_PNG"]))
assert drawn == ["naive", "naive_twin"], drawn
print("OK")
'''


def test_a_registry_entry_is_all_a_new_implementation_needs(tmp_path):
    env = dict(os.environ, VERIFY_ATTN_GRID="tiny", VERIFY_ATTN_DEVICE="cpu", VERIFY_ATTN_CPU_ONLY="1",
               OUT_PNG=str(tmp_path / "peak.png"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SKIP naive_gpu" in proc.stdout and "PASS naive_twin" in proc.stdout
    assert (tmp_path / "peak.png").exists()


def test_the_impl_parameter_leads_with_the_newest_kernel_under_test():
    """asv's graph pages open on a parameter's first value: the newest kernel under test with
    a backend on the device, then older kernels, their pinned-path variants, the baseline, the
    peers, and last those with no backend there."""
    from verify_attn import registry

    for device in ("cpu", "cuda"):
        order = registry.display_order(device)
        assert sorted(order) == sorted(registry.names())
        here = [n for n in order if device in registry.get(n).devices()]
        assert order[:len(here)] == tuple(here)
        kernels = [n for n in registry.names() if registry.get(n).under_test and not registry.get(n).baseline
                   and device in registry.get(n).devices()]
        variants = [n for n in kernels if registry.get(n).variant_of]
        mains = [n for n in kernels if n not in variants]
        assert list(here[:len(kernels)]) == mains[::-1] + variants
        assert here[len(kernels)] == registry.baseline()
        assert all(not registry.get(n).under_test for n in here[len(kernels) + 1:])


def test_each_tc_path_has_a_pinned_variant_gated_where_it_runs():
    """tc's plan picks among its paths (Plan::path, kernels/tc.cu); every path is also an entry
    of its own pinned to it, so that it is checked and timed on every GPU that can run it, not
    only where the plan picks it. The sm_90a paths run on compute capability 9.0 alone (the
    build compiles sm_90a there), where the plan takes wgmma_ws or wgmma_tma: their pinned variants
    would time tc's kernel twice, and wgmma_t (slower than wgmma) is not timed, so all three stay out of the
    kernels under test and are reached by name (check --impl, measure --impl); tc_mma (every
    other GPU's path) is gated and timed beside tc, tc_wgmma (tc's path where every element's
    keys fit in two tiles) gated on every named case but not timed at Quick's long prefixes, and
    tc_mma_mid / tc_mma_small (the portable path in an A100's and an sm_89/sm_120 card's
    configuration, which a 227 KB part never plans) gated but not timed."""
    from verify_attn import grid, registry

    tc = registry.get("tc")
    assert tc.paths == ("mma", "wgmma", "wgmma_t", "wgmma_ws", "wgmma_tma", "mma_mid", "mma_small")
    pinned = {i.path_name(i.path): i for i in registry.IMPLS.values() if i.variant_of == "tc"}
    assert {n: i.name for n, i in pinned.items()} == {"mma": "tc_mma", "wgmma": "tc_wgmma", "wgmma_t": "tc_wgmma_t",
                                                      "wgmma_ws": "tc_wgmma_ws", "wgmma_tma": "tc_wgmma_tma",
                                                      "mma_mid": "tc_mma_mid", "mma_small": "tc_mma_small"}
    for impl in pinned.values():
        assert impl.paths == tc.paths and impl.cpp == "tc" and impl.cuda_sources == tc.cuda_sources
        assert impl.tolerance == tc.tolerance
        assert impl.under_test == (impl.name in ("tc_mma", "tc_wgmma", "tc_mma_mid", "tc_mma_small"))
        assert impl.name in grid.VARIANTS
    for name in ("tc_wgmma", "tc_wgmma_t", "tc_wgmma_ws", "tc_wgmma_tma"):
        impl = registry.get(name)
        assert impl.unsupported("cuda", (9, 0)) is None
        for cc in ((8, 0), (8, 9), (10, 0), (12, 0)):
            assert impl.unsupported("cuda", cc), (name, cc)
    for name in ("tc_mma", "tc_mma_mid", "tc_mma_small"):
        assert registry.get(name).unsupported("cuda", (12, 0)) is None and registry.get(name).unsupported("cuda", (7, 5))
    # wgmma_tma takes what its plan branch does: a contiguous cache, q_len <= 65.
    tma = registry.get("tc_wgmma_tma")
    assert tma.rejects(chain=False, paged=False, kv_cols=4161, q_len=65) is None
    assert "q_len" in tma.rejects(chain=True, paged=False, kv_cols=521, q_len=66)
    assert "pages" in tma.rejects(chain=True, paged=True, q_len=9)
    assert registry.get("tc_wgmma_ws").rejects(chain=False, paged=True, q_len=300) is None
    from verify_attn import profile, suite

    for device in ("cuda", "cpu", "tiny"):
        quick = grid.SELECTIONS[device]["quick"]
        assert quick.exclude == grid.GATED_ONLY == ("tc_wgmma", "tc_mma_mid", "tc_mma_small")
    assert {"tc_mma", "tc_wgmma", "tc_mma_mid", "tc_mma_small"} <= set(suite.gated())
    assert not set(grid.GATED_ONLY) & set(suite.impls("quick"))
    assert "tc_mma" in suite.impls("quick") and "tc_wgmma" not in profile.impls()
