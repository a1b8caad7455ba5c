"""The compiler's resource report parses into numbers for every kernel and architecture."""

import shutil
import time

import pytest

from verify_attn import build, prebuild, registry, resources


def test_occupancy_limits():
    assert resources.occupancy("sm_90", 256, 92, 46992) == 2   # registers bind
    assert resources.occupancy("sm_90", 256, 32, 0) == 8       # threads bind
    assert resources.occupancy("sm_120", 256, 32, 60000) == 1  # shared memory binds


def test_occupancy_on_an_a100():
    assert resources.occupancy("sm_80", 256, 32, 0) == 8           # threads bind, as on sm_90
    assert resources.occupancy("sm_80", 256, 32, 100 * 1024) == 1  # 164 KB an SM: one such block
    assert resources.occupancy("sm_90", 256, 32, 100 * 1024) == 2  # 228 KB: two


def test_the_cached_report_is_keyed_by_the_architectures(tmp_path, monkeypatch):
    """A report made for other architectures (or other limits) is not read back as this one."""
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path))
    now = resources.cache_path()
    monkeypatch.setattr(resources, "ARCHS", ("sm_90", "sm_120"))
    assert resources.cache_path() != now
    monkeypatch.setattr(resources, "ARCHS", resources.ARCHS + ("sm_80",))
    assert resources.cache_path() != now  # the same set in another order: another report's rows
    monkeypatch.undo()
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path))
    assert resources.cache_path() == now
    monkeypatch.setitem(resources.LIMITS, "sm_80", {**resources.LIMITS["sm_80"], "smem": 100 * 1024})
    assert resources.cache_path() != now


def test_a_kernel_compiled_out_is_a_stub_and_nothing_else():
    """A trap (with the line info -lineinfo adds) is a stub; a trap among other work is not."""
    ptx = """
.visible .entry stub(
	.param .u64 stub_param_0
)
.maxntid 256
{

	.loc	1 9 0
	// begin inline asm
	trap;
	// end inline asm
	ret;

}
.visible .entry real(
	.param .u64 real_param_0
)
{
	.reg .b32 	%r<2>;
	mov.u32 	%r1, %tid.x;
	@%p1 trap;
	ret;

}
"""
    assert resources._stubs(ptx) == {"stub"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_report_covers_every_kernel(tmp_path, monkeypatch):
    """Made the way the suite makes it: by a prebuild process, while the first classes run;
    the benchmark's own call then reads what that process wrote."""
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path))
    procs = prebuild.start(("resources",))
    assert [p.args[-1] for p in procs] == ["resources"]
    lock = resources.cache_path().with_suffix("")
    deadline = time.monotonic() + 60
    while not build.busy(lock) and procs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert build.busy(lock), "the compiling process holds the report's lock"
    assert prebuild.start(("resources",)) == []  # a second set-up leaves it to that process
    assert procs[0].wait(timeout=900) == 0, (tmp_path / "prebuild.log").read_text()
    assert resources.cache_path().exists() and prebuild.start(("resources",)) == []
    t0 = time.perf_counter()
    report = resources.report()
    assert time.perf_counter() - t0 < 5, "read from the cache, not compiled again"
    for arch in resources.ARCHS:
        assert set(resources.of_impl(report, "naive", arch)) == {"naive_scores", "naive_softmax", "naive_output"}
        for impl in (n for n, i in registry.IMPLS.items() if i.cuda_sources):
            kernels = resources.of_impl(report, impl, arch)
            assert kernels, f"{impl}: no kernels in the report"
            assert all(k["spill_stores"] == 0 and k["spill_loads"] == 0 for k in kernels.values()), (impl, arch)
        tc = resources.of_impl(report, "tc", arch)
        if arch == "sm_90":  # setmaxnreg's pool: 2 x 128 x 224 (consumers) + 128 x 56 (producer) = 384 x 168;
            ws = tc["tc_attn_ws"]  # fewer at launch and .inc would wait forever
            assert ws["threads"] == 384 and ws["registers"] == 168
        else:  # the sm_90a paths are a trap there: not reported, the portable path is
            assert not {"tc_attn_ws", "tc_attn_ws_deal", "tc_attn_wg"} & set(tc), sorted(tc)
            assert any(name.startswith("tc_attn<") for name in tc), sorted(tc)
        flash = resources.of_impl(report, "flash", arch)["flash_split"]
        assert flash["threads"] == 256 and 32 < flash["registers"] <= 255 and flash["smem"] > 0
        assert flash["spill_stores"] == 0 and 0 < flash["occupancy"] <= 1
