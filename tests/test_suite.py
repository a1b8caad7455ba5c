"""What the suite's measurement leaves out, and says so (verify_attn.suite, verify_attn.grid)."""

import pytest


def test_the_baseline_is_left_out_past_its_score_limit_with_the_reason(monkeypatch):
    from verify_attn import grid, suite

    # The five full-grid points past the limit on the GPU (0.2-0.9 s a naive call at effa37c).
    cuda_full = grid.SELECTIONS["cuda"]["full"].points()
    over = sorted(pt for pt in cuda_full if grid.not_run("naive", *pt))
    assert over == [(16, 65, 65536), (64, 17, 65536), (64, 33, 65536), (64, 65, 16384), (64, 65, 65536)]
    assert not any(grid.not_run(i, 64, 65, 65536) for i in ("tc", "flash", "torch"))
    assert not any(grid.not_run("naive", *pt) for pt in grid.SELECTIONS["cuda"]["quick"].points())

    monkeypatch.setenv("VERIFY_ATTN_GRID", "tiny")
    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    monkeypatch.setenv("VERIFY_ATTN_ANCHOR", "off")
    monkeypatch.setattr(grid, "BASELINE_MAX_SCORES", 1000)  # 8 x 9 x 9 = 648 at prefix 0; 148,104 at 2,048
    out = suite.measure_grid(None, "full", timed=False)
    short, long = out["results"][(8, 9, 0, "naive")], out["results"][(8, 9, 2048, "naive")]
    assert short["skipped"] == "" and short["ok"]
    assert set(long) == {"skipped"} and "148,104" in long["skipped"] and "BASELINE_MAX_SCORES" in long["skipped"]
    assert out["results"][(8, 9, 2048, "flash")]["ok"]  # the others still run there


def _fresh(code: str, env=None) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_asvs_fork_server_holds_no_torch(tmp_path, monkeypatch):
    """asv forks every benchmark run from a server that imported the benchmark modules: they
    must not import torch (a fork then costs 8.8 ms, not 1.2, on the H200's host), and a run's setup and track_
    methods read the plain data setup_cache returned without importing it either, each run
    unpickling its own entry."""
    import pickle

    from verify_attn import suite

    env = {"VERIFY_ATTN_GRID": "tiny", "VERIFY_ATTN_DEVICE": "cpu", "VERIFY_ATTN_ANCHOR": "off"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from benchmarks.common import stored

    measured = suite.measure_quick()
    cache = tmp_path / "cache.pickle"  # as the set-up returns it: each entry in a file of its own (common.Entries)
    cache.write_bytes(pickle.dumps(stored(measured, str(tmp_path / "entries"))))
    # The results (the bulk on a GPU) live in the entry files: the cache is the rest and their index.
    rest = len(pickle.dumps(measured)) - len(pickle.dumps(measured["results"]))
    assert len(cache.read_bytes()) < rest + 256 < len(pickle.dumps(measured))
    assert len(list((tmp_path / "entries").iterdir())) == len(measured["results"])
    out = _fresh(f"""
import pickle, sys
import benchmarks.bench_machine, benchmarks.bench_profile, benchmarks.bench_resources
from benchmarks.bench_verify_attn import Quick, QuickCases
print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
cache = pickle.loads(open({str(cache)!r}, "rb").read())
bench = Quick()
bench.setup(cache, 8, 9, 2048, "flash")
print(bench.track_error(cache, 8, 9, 2048, "flash") > 0, bench.track_time(cache, 8, 9, 2048, "flash")["number"] >= 1)
gate = QuickCases()
gate.setup(cache, "seed_2x8x9x9", "flash")
print(gate.track_error(cache, "seed_2x8x9x9", "flash") >= 0)
print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
""", env)
    assert out.split() == ["[]", "True", "True", "True", "[]"], out


def test_the_device_is_decided_without_torch():
    from verify_attn import gpu

    assert gpu._visible(4, "") == 0 and gpu._visible(4, "0,1") == 2 and gpu._visible(4, "2,-1,3") == 1
    assert gpu._visible(2, "0,5,1") == 1 and gpu._visible(4, "GPU-1234") is None
    out = _fresh("import sys\nfrom verify_attn import gpu\nprint(gpu.device(), gpu.torch_cuda(), 'torch' in sys.modules)",
                 {"VERIFY_ATTN_DEVICE": ""})
    import torch

    expected = "cuda" if torch.cuda.device_count() else "cpu"
    device, built_with_cuda, imported = out.split()
    assert device == expected and built_with_cuda == str(torch.version.cuda is not None)
    assert imported == "False" or built_with_cuda == "True"  # a CUDA torch may be asked (no NVML)


def test_serving_chain_times_tc_beside_flashmla_on_ragged_chain_batches(monkeypatch):
    """ServingChain: the serving batches as chain trees in a contiguous cache whose rows reach
    each element's last 64-token page (what FlashMLA reads in place), tc and FlashMLA only;
    measured here on the CPU with short prefixes and flash let in (tc and FlashMLA have no CPU
    form: they skip with their reasons)."""
    import torch

    from verify_attn import cases, grid, suite
    from verify_attn.shapes import is_chain

    sel = grid.SELECTIONS["cuda"]["serving_chain"]
    assert (sel.tree, sel.paged, sel.pad_to) == ("chain", False, 64)
    assert sel.points() == grid.SELECTIONS["cuda"]["serving"].points()
    assert grid.impls_of("serving_chain", ["tc", "flashmla", "flash", "torch", "naive"]) == ["tc", "flashmla"]

    case = cases.serving_case(8, 16, 9, tree="chain", paged=False, pad_to=64)
    assert case.name == "serving_b8_h16_q9_chain" and case.prefix_lens == cases.serving_prefixes(8)
    assert len(set(case.prefix_lens)) == 8 and case.kv_cols % 64 == 0 and case.kv_cols >= max(case.prefix_lens) + 9

    monkeypatch.delenv("VERIFY_ATTN_GRID", raising=False)
    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    monkeypatch.setenv("VERIFY_ATTN_ANCHOR", "off")
    monkeypatch.setitem(grid.SELECTIONS["cpu"], "serving_chain",
                        grid.dataclasses.replace(sel, batches=(3,), heads=(8,), q_lens=(9,),
                                                 exclude=tuple(i for i in sel.exclude if i != "flash")))
    monkeypatch.setattr(cases, "serving_prefixes", lambda batch: (70, 5, 130)[:batch])
    inputs = cases.make_inputs(cases.serving_case(3, 8, 9, tree="chain", paged=False, pad_to=64))
    assert inputs.kv.shape[1] == 192 and inputs.kv_indices is None
    assert all(is_chain(p) for p in inputs.parent.tolist()) and inputs.prefix_lens.tolist() == [70, 5, 130]
    assert torch.isfinite(inputs.kv).all()  # FlashMLA multiplies the rows past kv_len by a zero probability
    from verify_attn import flashmla

    pages, table = flashmla.pages(inputs.kv)  # read in place as FlashMLA's 64-token pages
    assert table.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and pages.shape[:2] == (9, 64)
    out = suite.measure_serving("serving_chain")
    assert set(out["results"]) == {(3, 8, 9, i) for i in ("tc", "flashmla", "flash")}
    flash = out["results"][(3, 8, 9, "flash")]
    assert flash["skipped"] == "" and flash["ok"] and len(flash["samples"]) >= 2 and flash["plan"] is None
    assert "no cpu implementation" in out["results"][(3, 8, 9, "tc")]["skipped"]
    assert out["results"][(3, 8, 9, "flashmla")]["skipped"]


def test_short_points_are_timed_again_in_fresh_processes_and_pooled(monkeypatch):
    """verify_attn.repeat: a judged kernel's short calls are checked and timed beside the twin
    again in another process, and their samples and drift-free values pooled with the first
    process's (on the CPU with the limit raised and flash and naive repeated instead of tc,
    which has no CPU form: there no point is short and one process runs)."""
    from verify_attn import anchor, repeat, suite

    assert repeat.LIMITS["cpu"] == {} and repeat.processes(repeat.LIMITS["cuda"]) > 1
    monkeypatch.setenv("VERIFY_ATTN_GRID", "tiny")
    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    monkeypatch.setenv(anchor.ENV, "HEAD")
    monkeypatch.setattr(anchor, "_state", {})
    # flash and naive repeated instead of tc; the second repeat process takes no call that short
    monkeypatch.setitem(repeat.LIMITS, "cpu", {"flash": (10.0, 0.0), "naive": (10.0,)})
    # Quick by its own limits: flash in two repeat processes there
    monkeypatch.setitem(repeat.QUICK_LIMITS, "cpu", {"flash": (10.0, 10.0), "naive": (10.0,)})
    import statistics

    out = suite.measure_grid(None, "full")
    assert all("processes" not in e for e in out["results"].values())  # measure_grid alone: one process
    assert repeat.short_points(out["results"], {"tc": (10.0,)}, 0) == []  # the CPU has no tc
    quick = suite.measure_quick()  # Quick's timed points are repeated by its own processes
    timed = {k[-1]: e.get("processes") for k, e in quick["results"].items() if not e["skipped"]}
    assert timed == {"flash": 3, "naive": 2}
    with suite.repeat_workers() as workers:
        assert len(workers) == 2
        assert repeat.extend({"cold": out["results"]}, workers) == [0, 0]  # cold is not judged: not repeated
        suite.repeat_short({"full": out}, workers)
    timed = {k: e for k, e in out["results"].items() if not e["skipped"]}
    assert sorted(timed) == [(8, 9, p, i) for p in (0, 2048) for i in ("flash", "naive")]  # no CPU form of the rest
    for key, e in timed.items():
        # the CPU timer's 7 samples a process, one drift-free value a round at an odd count
        assert e["processes"] == 2 and len(e["samples"]) == 14 and len(e["anchor"]) == 14, key
        assert e["median"] == statistics.median(e["samples"]) and e["ok"]
        # the drift-free values level-free: their median is the mean of the processes' medians
        assert [len(p) for p in e["anchor_by_process"]] == [7, 7]
        level = statistics.mean(map(statistics.median, e["anchor_by_process"]))
        assert statistics.median(e["anchor"]) == pytest.approx(level, rel=1e-12)

    results = {(8, 9, 0, "flash"): {"samples": [1.0, 1.0], "anchor": [1.0], "median": 1.0, "dropped": 0, "ok": True}}
    repeat.pool(results, {(8, 9, 0, "flash"): {"ok": False, "reason": "max_rel 2.1", "skipped": ""}})
    assert not results[(8, 9, 0, "flash")]["ok"] and "failed in a repeat process: max_rel 2.1" in \
        results[(8, 9, 0, "flash")]["reason"]


def test_level_free_values_have_the_mean_of_the_process_medians_as_their_median():
    """verify_attn.repeat.level_free: each process scaled to the mean of the processes'
    medians; the median of all is that mean (processes of equal counts, even or odd), and the
    scatter inside each process keeps its shape."""
    import random
    import statistics

    from verify_attn import repeat

    rng = random.Random(7)
    for count in (7, 8):
        by_process = [[rng.gauss(level, 0.004) for _ in range(count)] for level in (0.98, 1.01, 0.995, 1.02)]
        values = repeat.level_free(by_process)
        level = statistics.mean(map(statistics.median, by_process))
        assert statistics.median(values) == pytest.approx(level, rel=1e-12)
        for k, p in enumerate(by_process):
            mine = values[k * count:(k + 1) * count]
            assert statistics.median(mine) == pytest.approx(level, rel=1e-12)
            assert [v / x for v, x in zip(mine, p)] == pytest.approx([mine[0] / p[0]] * count, rel=1e-12)
    assert repeat.level_free([[1.0, 3.0]]) == [1.0, 3.0]  # one process: as measured


def test_short_points_are_each_kernels_calls_under_the_processs_limit():
    """verify_attn.repeat.short_points: repeat process k takes a point of a kernel LIMITS names
    (tc_mma by the tc it is a variant of) timed with a yardstick under that kernel's k-th limit;
    flash, a peer, a longer call, a point without drift-free values and a process past the
    kernel's limits are not. The H200's limits: tc's calls under 30 us in five processes, under
    0.1 ms in three; naive's under 0.3 ms in three. Quick's (QUICK_LIMITS): tc's under 0.1 ms in nine."""
    from verify_attn import repeat

    def entry(median, anchor=(1.0,)):
        return {"median": median, "anchor": list(anchor)}

    results = {(16, 9, 65536, "tc"): entry(7e-5), (16, 9, 65536, "tc_mma"): entry(9e-5),
               (16, 9, 2048, "tc_mma"): entry(2.4e-5), (64, 9, 65536, "tc"): entry(1.6e-4),
               (16, 9, 0, "flash"): entry(9e-6), (64, 33, 0, "naive"): entry(1.15e-4),
               (16, 9, 0, "torch"): entry(5e-5), (16, 9, 2048, "tc"): entry(2e-5, anchor=())}
    limits = repeat.LIMITS["cuda"]
    assert repeat.processes(limits) == 4
    taken = [sorted(repeat.short_points(results, limits, k)) for k in range(4)]
    assert taken[0] == taken[1] == [(16, 9, 2048, "tc_mma"), (16, 9, 65536, "tc"), (16, 9, 65536, "tc_mma"),
                                    (64, 33, 0, "naive")]
    assert taken[2] == taken[3] == [(16, 9, 2048, "tc_mma")]
    # Quick's: every tc call under 0.1 ms in all eight processes, naive's as LIMITS has them,
    # and no point in fewer processes than LIMITS gives it
    quick = repeat.QUICK_LIMITS["cuda"]
    assert repeat.processes(quick) == 8 and quick["naive"] == limits["naive"]
    taken_quick = [sorted(repeat.short_points(results, quick, k)) for k in range(8)]
    assert taken_quick[0] == taken_quick[1] == taken[0]
    assert all(t == [k for k in taken[0] if k[-1] != "naive"] for t in taken_quick[2:])
    for kernel, mine in limits.items():
        assert all(k < len(quick[kernel]) and quick[kernel][k] >= lim for k, lim in enumerate(mine)), kernel


def test_repeat_workers_that_get_no_points_exit(monkeypatch):
    """A worker started ahead (repeat.Workers) that no points reach exits 0 when the block ends,
    also when the block raises; its temporary folder goes with it."""
    import os

    from verify_attn import repeat

    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    with repeat.Workers({"tc": (1.0,)}) as workers:
        assert len(workers) == 1
        procs, tmp = [p for p, _ in workers.procs], workers.tmp.name
    assert [p.returncode for p in procs] == [0] and not os.path.exists(tmp)
    with pytest.raises(KeyError):
        with repeat.Workers({"tc": (1.0,)}) as workers:
            procs = [p for p, _ in workers.procs]
            raise KeyError("the measurement failed")
    assert [p.returncode for p in procs] == [0]


def test_repeat_workers_left_while_timing_end_and_let_the_error_through(monkeypatch):
    """A block left while a worker holds its points (its stdin already closed, as in
    Workers.time) ends that worker and raises the block's own error, not one of the clean-up."""
    import os

    from verify_attn import repeat

    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    with pytest.raises(KeyError):
        with repeat.Workers({"tc": (1.0, 1.0)}) as workers:
            procs, tmp = [p for p, _ in workers.procs], workers.tmp.name
            procs[0].stdin.close()  # as time() leaves it while the worker measures
            raise KeyError("interrupted while timing")
    assert all(p.returncode is not None for p in procs) and not os.path.exists(tmp)
    assert procs[1].returncode == 0  # the one never reached was told and exited


def test_no_repeat_workers_without_the_anchor(monkeypatch):
    """Only drift-free series are repeated: with the anchor off no worker starts."""
    from verify_attn import repeat, suite

    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    monkeypatch.setattr(repeat, "LIMITS", {"cpu": {"tc": (1.0, 1.0), "naive": (1.0,)}})
    with suite.repeat_workers() as workers:
        assert len(workers) == 2
    monkeypatch.setenv("VERIFY_ATTN_ANCHOR", "off")
    with suite.repeat_workers() as workers:
        assert len(workers) == 0
