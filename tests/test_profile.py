"""The profiler's series on the CPU: ncu's raw-page CSV read back, metric names chosen from what
ncu offers, kernel launches attributed to their (point, impl) by NVTX range, one call's figures,
the whole run through a stand-in ncu, and the asv class where nothing can be profiled.

The sample exports follow the format of Nsight Compute's CLI documentation (`--csv --page raw
--print-units base`: a header row of column names, the launch columns then one column per
metric by name; a units row, empty under the launch columns; one row per profiled launch;
ncu's own `==PROF==` lines around it; `--print-nvtx-rename kernel`: the same rows and IDs with
each kernel named by its innermost NVTX push/pop range), and the metric names are the Hopper
names verify_attn.profile asks for.
"""

import json
import math
import os
import stat
import sys
from pathlib import Path

import pytest

from verify_attn import ncu, profile, suite

LAUNCH = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC"]
M = {q: names[0] for q, names in profile.candidates().items()}
COLUMNS = [(M["duration"], "nsecond"), (M["dram_bytes"], "byte"), (M["dram_pct"], "%"), (M["issue_pct"], "%"),
           (M["occupancy_pct"], "%"), (M["registers"], "register/thread"), (M["dynamic_smem_bytes"], "byte/block"),
           (M["pipe_gmma"], "%"), (M["pipe_hmma"], "%"),
           (M["stall_long_scoreboard"], ""), (M["stall_barrier"], ""),
           ("smsp__average_warps_issue_stalled_selected_per_issue_active.ratio", ""),  # not asked for: ignored
           (M["sm_active_max"], "cycle"), (M["sm_active_avg"], "cycle")]
# (kernel, its NVTX range, duration ns, DRAM bytes, dram %, issue %, occupancy %, regs, dyn smem, gmma %, hmma %,
#  long scoreboard, barrier, selected, the busiest SM's active cycles, the mean SM's)
LAUNCHES = [
    ("void verify_attn::tc_attn_wg<2, 4>(verify_attn::Params, verify_attn::TcArgs)", "va-profile:64:9:65536:tc",
     "90,000", "75,500,000", "20.0", "30.0", "12.0", "168", "120,832", "60.0", "0.0", "1.5", "0.5", "9.0", "171,000", "150,000"),
    ("verify_attn::tc_merge(verify_attn::Params, verify_attn::TcArgs)", "va-profile:64:9:65536:tc",
     "10,000", "4,500,000", "50.0", "10.0", "40.0", "32", "0", "0.0", "0.0", "0.5", "4.0", "1.0", "19,000", "9,500"),
    ("void verify_attn::tc_attn<2, 4>(verify_attn::Params, verify_attn::TcArgs)", "va-profile:64:9:65536:tc_mma",
     "200,000", "80,000,000", "n/a", "25.0", "12.0", "255", "98,304", "0.0", "45.0", "0.2", "2.0", "1.0", "380,000", "n/a"),
    ("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)", "fill",
     "1,000", "1,000", "1.0", "1.0", "1.0", "16", "0", "0.0", "0.0", "0.1", "0.1", "1.0", "2,000", "1,000"),
]


def quoted(fields) -> str:
    return ",".join(f'"{f}"' for f in fields)


def export(renamed: bool = False, launches=LAUNCHES, columns=COLUMNS) -> str:
    """A raw-page export in ncu's CSV form (kernels named by their NVTX range when renamed)."""
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3)", quoted(LAUNCH + [c for c, _ in columns]),
             quoted([""] * len(LAUNCH) + [u for _, u in columns])]
    for n, (kernel, rng, *values) in enumerate(launches):
        lines.append(quoted([str(n), "4242", "python3", "h200", rng if renamed else kernel, "1", "7", "(128, 1, 1)",
                             "(132, 1, 1)", "0", "9.0", *values[:len(columns)]]))
    return "\n".join(lines + ["==PROF== Disconnected from process 4242"]) + "\n"


def test_parse_raw_reads_values_in_si_units():
    rows = ncu.parse_raw(export())
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    first = rows[0]["values"]
    assert first[M["duration"]] == pytest.approx(90e-6)  # nsecond -> seconds, thousands separators dropped
    assert first[M["dram_bytes"]] == 75_500_000 and first[M["dynamic_smem_bytes"]] == 120_832
    assert first[M["registers"]] == 168 and first[M["pipe_gmma"]] == 60.0
    assert math.isnan(rows[2]["values"][M["dram_pct"]])  # n/a
    assert rows[0]["kernel"].startswith("void verify_attn::tc_attn_wg<")


def test_parse_raw_without_a_raw_page_is_one_line():
    with pytest.raises(ncu.NcuError, match="no raw page in ncu's export: ==ERROR== The application returned"):
        ncu.parse_raw("==ERROR== The application returned an error code (1).\n")


@pytest.mark.parametrize("unit, scale", [("nsecond", 1e-9), ("usecond", 1e-6), ("msecond", 1e-3), ("second", 1.0),
                                         ("byte", 1.0), ("Kbyte", 1e3), ("Gbyte/second", 1e9),
                                         ("byte/nsecond", 1e9), ("%", 1.0), ("register/thread", 1.0), ("", 1.0)])
def test_unit_scale(unit, scale):
    assert ncu.unit_scale(unit) == pytest.approx(scale)


def test_query_parsing_text_and_csv():
    text = ("Device NVIDIA H200 (GH100)\n----\nMetric Name                    Metric Description\n"
            "dram__bytes                    # of bytes accessed in DRAM\n"
            "smsp__average_warps_issue_stalled_gmma_per_issue_active   ratio of ...\n")
    assert ncu.parse_query(text) == {"dram__bytes", "smsp__average_warps_issue_stalled_gmma_per_issue_active"}
    csv_text = ('"Metric Name","Metric Type","Metric Unit","Metric Description"\n'
                '"gpu__time_duration","Counter","nsecond","Duration"\n')
    assert ncu.parse_query(csv_text) == {"gpu__time_duration"}


def test_choose_takes_the_first_offered_candidate_and_names_the_missing():
    known = {n.split(".")[0] for names in profile.candidates().values() for n in names}
    known -= {"dram__throughput", "sm__pipe_tensor_cycles_active", "smsp__average_warps_issue_stalled_gmma_per_issue_active"}
    chosen, missing = profile.choose(known)
    assert chosen["dram_pct"] == "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"  # the second candidate
    assert chosen["registers"] == "launch__registers_per_thread"  # launch attributes: always collected
    assert sorted(missing) == ["pipe_tensor", "stall_gmma"]
    everything, none_missing = profile.choose(None)  # the query failed: every first candidate, ncu decides
    assert everything == M and none_missing == []
    assert profile.choose(set())[1] == [q for q in profile.candidates() if not M[q].startswith("launch__")]


def test_refused_names_only_the_metrics_in_error_lines():
    log = ("==PROF== Connected to process 1\n"
           "==ERROR== Failed to find metric sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active\n")
    asked = [M["pipe_tensor"], M["pipe_hmma"], M["duration"]]
    assert ncu.refused(log, asked) == [M["pipe_tensor"]]
    assert ncu.refused("==PROF== all fine", asked) == []


def test_attribution_joins_the_two_exports_by_launch_id():
    calls, stray = profile.attribute(ncu.parse_raw(export()), ncu.parse_raw(export(renamed=True)))
    assert set(calls) == {(64, 9, 65536, "tc"), (64, 9, 65536, "tc_mma")}
    assert [l["id"] for l in calls[(64, 9, 65536, "tc")]] == [0, 1]  # the attention kernel and its merge
    assert [l["kernel"][:30] for l in stray] == [LAUNCHES[3][0][:30]]  # not in a point's range
    # The range's name may come with its enclosing one: still found.
    assert profile.point_of("verify_attn.profile/va-profile:16:33:16384:flash") == (16, 33, 16384, "flash")


def test_kernel_name_drops_namespaces_templates_and_parameters():
    assert profile.kernel_name("void verify_attn::tc_attn_wg<2, 4>(verify_attn::Params, verify_attn::TcArgs)") == "tc_attn_wg"
    assert profile.kernel_name("verify_attn::<unnamed>::tc_attn<verify_attn::<unnamed>::Config<2, 4, 2, 2, 2, true>>"
                               "(verify_attn::Params, verify_attn::<unnamed>::TcArgs)") == "tc_attn"  # as a source page names it
    assert profile.kernel_name("va_base::<unnamed>::tc_attn_tma(va_base::Params)") == "tc_attn_tma"  # ab's base build


def test_summarise_one_call():
    calls, _ = profile.attribute(ncu.parse_raw(export()), ncu.parse_raw(export(renamed=True)))
    tc = profile.summarise(calls[(64, 9, 65536, "tc")], M)
    assert tc["kernels"] == ["tc_attn_wg", "tc_merge"]
    assert tc["duration_s"] == pytest.approx(100e-6)
    assert tc["dram_bytes_per_s"] == pytest.approx(80e6 / 100e-6)  # both kernels' bytes over their time
    assert tc["dram_pct"] == pytest.approx(0.9 * 20 + 0.1 * 50)  # duration-weighted
    assert tc["occupancy_pct"] == pytest.approx(0.9 * 12 + 0.1 * 40)
    assert (tc["registers"], tc["dynamic_smem_bytes"]) == (168, 120_832)  # the main (longest) kernel's
    assert tc["sm_tail"] == pytest.approx(1.14)  # the main kernel's too (the merge's 2.0 is not the call's)
    assert (tc["tensor_pipe"], tc["tensor_pipe_pct"]) == ("gmma", pytest.approx(54.0))
    assert tc["stalls"]["barrier"] == pytest.approx(0.9 * 0.5 + 0.1 * 4.0)
    assert tc["top_stall"] == "long_scoreboard"  # 1.4 against barrier's 0.85; "selected" (9.0) is not a stall
    assert "selected" not in tc["stalls"]
    mma = profile.summarise(calls[(64, 9, 65536, "tc_mma")], M)
    assert (mma["tensor_pipe"], mma["top_stall"], mma["kernels"]) == ("hmma", "barrier", ["tc_attn"])
    assert math.isnan(mma["sm_tail"])  # the mean is n/a, so the tail is NaN
    assert math.isnan(mma["dram_pct"])
    # A metric not chosen (ncu does not offer it): NaN, the rest stands.
    partial = profile.summarise(calls[(64, 9, 65536, "tc")], {k: v for k, v in M.items() if k != "registers"})
    assert math.isnan(partial["registers"]) and partial["dynamic_smem_bytes"] == 120_832


# ---------------------------------------------------------------------------------------
# The whole run through a stand-in ncu: what it is asked, what it answers.

FAKE = r'''#!{python}
import json, os, sys
args = sys.argv[1:]
state = os.environ["FAKE_NCU"]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
conf = json.load(open(os.path.join(state, "conf.json")))
if "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.0.0 (stand-in)")
elif "--query-metrics" in args:
    if conf.get("query_fails") or (conf.get("no_csv_query") and "--csv" in args):
        print("==ERROR== unrecognised option")
        sys.exit(1)
    if "--csv" in args:
        print('"Metric Name","Metric Type","Metric Unit","Metric Description"')
    for name in conf["offered"]:
        print(('"%s","Counter","","-"' if "--csv" in args else "%-60s  description") % name)
elif "--import" in args and "source" in args:
    sys.stdout.write(open(os.path.join(state, "source.csv")).read())
elif "--import" in args:
    name = "renamed.csv" if "--print-nvtx-rename" in args else "plain.csv"
    sys.stdout.write(open(os.path.join(state, name)).read())
else:
    metrics = args[args.index("--metrics") + 1].split(",") if "--metrics" in args else []
    bad = [m for m in metrics if m in conf.get("refuse", [])]
    if conf.get("fail"):
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
        sys.exit(1)
    if bad:
        print("==ERROR== Failed to find metric " + bad[0])
        sys.exit(1)
    report = args[args.index("--export") + 1]
    open(report + ".ncu-rep", "w").write("report")
    manifest = args[args.index("--manifest") + 1]
    json.dump({{"profiled": ["va-profile:64:9:65536:tc", "va-profile:64:9:65536:tc_mma"],
               "skipped": {{"va-profile:64:9:65536:flash": "fails its check: stand-in"}}}}, open(manifest, "w"))
    print('==PROF== Profiling "tc_attn_wg" - 0: 0%....50%....100% - 9 passes')
    print('==PROF== Profiling "tc_merge" - 1: 0%....50%....100% - 8 passes')
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A stand-in ncu on PATH, its answers in conf.json; returns (state dir, set conf)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(), state.mkdir()
    exe = bin_dir / "ncu"
    exe.write_text(FAKE.replace("{python}", sys.executable).replace("{{", "{").replace("}}", "}"))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    (state / "plain.csv").write_text(export())
    (state / "renamed.csv").write_text(export(renamed=True))
    (state / "source.csv").write_text((Path(__file__).parent / "data" / "ncu_source_tc_attn_tma.csv").read_text())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU", str(state))
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VERIFY_ATTN_PREBUILD", "0")
    offered = sorted({n.split(".")[0] for names in profile.candidates().values() for n in names})

    def configure(**conf):
        (state / "conf.json").write_text(json.dumps({"offered": offered, **conf}))

    configure()
    return state, configure


def calls_of(state):
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def test_run_through_ncu(stand_in, capsys):
    state, _ = stand_in
    result = profile.run([(64, 9, 65536)])
    assert set(result["points"]) == {(64, 9, 65536, "tc"), (64, 9, 65536, "tc_mma")}
    assert result["points"][(64, 9, 65536, "tc")]["registers"] == 168
    assert result["skipped"] == {(64, 9, 65536, "flash"): "fails its check: stand-in"}
    assert result["passes"] == [9, 8] and "2025.3" in result["ncu"]
    exported = {name for name, _ in COLUMNS}
    assert result["metrics"] == {q: n for q, n in M.items() if n in exported}
    assert result["missing"] == sorted(q for q, n in M.items() if n not in exported)  # each said in one line
    (args,) = [a for a in calls_of(state) if "--export" in a]
    assert args[args.index("--nvtx-include") + 1] == "verify_attn.profile/"
    assert args[args.index("--cache-control") + 1] == "all" and "--clock-control" not in args  # ncu's own clocks
    target = args[args.index("--force-overwrite") + 1:]
    assert target[:4] == [sys.executable, "-m", "verify_attn.profile", "--target"]
    impls = target[target.index("--impls") + 1].split(",")
    assert impls[:3] == ["tc", "flash", "tc_mma"] and set(impls[3:]) <= {"tc_wgmma", "tc_wgmma_t"}  # tc's pinned paths
    assert "naive" not in target
    assert "1 profiled launches outside any point's range, left out: vectorized_elementwise_kernel" in capsys.readouterr().err
    assert (profile.work_dir() / "raw-nvtx.csv").exists()  # the files stay for a person


def test_source_mode_reads_each_calls_main_kernel(stand_in, capsys, tmp_path):
    state, _ = stand_in
    stale = profile.work_dir() / "source" / "source-chain-h8-q9-p65536-tc.csv"  # an earlier run's page
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("x")
    result = profile.run_source([(64, 9, 65536)], top=3)
    assert not stale.exists()
    assert set(result["points"]) == {(64, 9, 65536, "tc"), (64, 9, 65536, "tc_mma")}
    (args,) = [a for a in calls_of(state) if "--export" in a]
    assert "--metrics" not in args and args[args.index("--warp-sampling-interval") + 1] == "1"
    assert [args[n + 1] for n, a in enumerate(args) if a == "--section"] == ["SourceCounters", "SpeedOfLight"]
    pages = [a for a in calls_of(state) if "source" in a]
    # tc's call is the attention kernel (90 us) and the merge (10 us): the attention kernel's page
    assert sorted(a[a.index("--launch-skip") + 1] for a in pages) == ["0", "2"]
    tc = result["points"][(64, 9, 65536, "tc")]
    assert tc["kernel"] == "tc_attn_wg" and tc["kinds"]["named barrier wait"] == 22800
    assert [i["kind"] for i in tc["instructions"]] == ["named barrier wait", "wgmma wait", "wgmma issue"]
    # each point's page under its name, for the stalls verb; a rerun's pages replace these
    assert Path(tc["page"]).name == "source-quick-h64-q9-p65536-tc.csv" and Path(tc["page"]).is_file()
    assert sorted(p.name for p in Path(tc["page"]).parent.glob("source-*.csv")) == [
        "source-quick-h64-q9-p65536-tc.csv", "source-quick-h64-q9-p65536-tc_mma.csv"]
    assert profile.main(["--source", "--points", "64:9:65536", "--top", "2", "--json", str(tmp_path / "s.json")]) == 0
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["points"]["64:9:65536:tc"]["kinds"]["named barrier wait"] == 22800
    out = capsys.readouterr().out
    assert "h64 q9 p65536 tc (tc_attn_wg): 41310 warp samples" in out and "named barrier wait 55.2%" in out
    assert "  page: " in out and "source-quick-h64-q9-p65536-tc_mma.csv" in out


def test_source_mode_with_a_base_profiles_both_builds(stand_in):
    """--base (ab --source): the target is asked for the base's build too, and its launches,
    named impl@va_base by their ranges, get pages of their own beside the head's."""
    state, _ = stand_in
    base = [(k.replace("tc_attn_wg<", "tc_attn_ws<"), r + "@va_base", *v) for k, r, *v in LAUNCHES[:2]]
    launches = [*LAUNCHES[:2], *base, *LAUNCHES[2:]]
    (state / "plain.csv").write_text(export(launches=launches))
    (state / "renamed.csv").write_text(export(renamed=True, launches=launches))
    result = profile.run_source([(64, 9, 65536)], variant="chain", names=["tc"], base="0123abcd")
    (args,) = [a for a in calls_of(state) if "--export" in a]
    assert args[args.index("--base") + 1] == "0123abcd" and args[args.index("--impls") + 1] == "tc"
    base_page = Path(result["points"][(64, 9, 65536, "tc@va_base")]["page"])
    assert base_page.name == "source-chain-h64-q9-p65536-tc@va_base.csv" and base_page.is_file()
    assert Path(result["points"][(64, 9, 65536, "tc")]["page"]).name == "source-chain-h64-q9-p65536-tc.csv"
    assert profile.point_of("verify_attn.profile/va-profile:64:9:65536:tc@va_base") == (64, 9, 65536, "tc@va_base")


def test_source_mode_refuses_a_page_without_samples(stand_in, capsys):
    state, _ = stand_in
    (state / "source.csv").write_text(export())  # a raw page where the source page belongs
    assert profile.main(["--source", "--points", "64:9:65536"]) == 1
    assert "no source page with warp samples" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        profile.main(["--source", "--top", "0"])


def test_a_metric_ncu_refuses_is_dropped_and_named(stand_in, capsys):
    state, configure = stand_in
    configure(query_fails=True, refuse=[M["pipe_tensor"]])  # no query: ncu's refusal decides
    result = profile.run([(64, 9, 65536)])
    assert "pipe_tensor" in result["missing"] and M["pipe_tensor"] not in result["metrics"].values()
    assert len([a for a in calls_of(state) if "--export" in a]) == 2  # profiled again without it
    err = capsys.readouterr().err
    assert err.count(f"ncu refused {M['pipe_tensor']}: profiling again without") == 1


def test_a_failed_ncu_is_one_line_and_no_series(stand_in, monkeypatch, capsys):
    _, configure = stand_in
    configure(fail=True)
    monkeypatch.setattr(suite, "device", lambda: "cuda")
    result = profile.recorded()
    assert result == {"error": "ncu exited 1: ==ERROR== ERR_NVGPUCTRPERM - The user does not have permission "
                               "to access NVIDIA GPU Performance Counters"}
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("[verify_attn] profile: no series: ncu exited 1") == 1


def test_no_ncu_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(suite, "device", lambda: "cuda")
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path))
    assert profile.recorded() == {"error": "ncu (Nsight Compute) not found: put it on PATH or set CUDA_HOME"}


def test_the_benchmark_on_the_cpu_records_nothing(monkeypatch):
    from benchmarks.bench_profile import Profile

    def no_ncu():
        raise AssertionError("ncu must not be looked for on the CPU")

    monkeypatch.setattr(suite, "device", lambda: "cpu")
    monkeypatch.setattr(ncu, "find", no_ncu)
    bench = Profile()
    result = bench.setup_cache()
    assert result == {"error": "no GPU: the profiler's series are GPU only"}
    with pytest.raises(NotImplementedError, match="GPU only"):
        bench.setup(result, 64, 9, 65536, "tc")


def test_the_benchmark_reads_a_profiled_call():
    from benchmarks.bench_profile import Profile

    calls, _ = profile.attribute(ncu.parse_raw(export()), ncu.parse_raw(export(renamed=True)))
    result = {"points": {k: profile.summarise(v, M) for k, v in calls.items()},
              "skipped": {(64, 9, 2048, "tc"): "fails its check: x"}}
    bench = Profile()
    bench.setup(result, 64, 9, 65536, "tc")
    assert bench.track_dram_gbps(result) == pytest.approx(800.0)
    assert bench.track_registers(result) == 168 and bench.track_kernels(result) == 2
    assert bench.track_stall_long_scoreboard(result) == pytest.approx(1.4)
    assert bench.track_sm_tail(result) == pytest.approx(1.14)
    assert math.isnan(bench.track_stall_gmma(result))  # not in the export: n/a, not a failure
    older = dict(result["points"][(64, 9, 65536, "tc")])
    del older["sm_tail"], older["kernels"]  # what an older commit's profile returned
    bench.call = older
    assert math.isnan(bench.track_sm_tail(result)) and math.isnan(bench.track_kernels(result))
    with pytest.raises(NotImplementedError, match="fails its check: x"):
        bench.setup(result, 64, 9, 2048, "tc")
    with pytest.raises(NotImplementedError, match="not a profiled Quick point"):
        bench.setup(result, 8, 9, 0, "flash")
    from verify_attn import gpu

    expected = [[8, 16, 64], [9, 33], [2048, 16384, 65536]] if gpu.device() == "cuda" else [[8], [9], [0, 2048]]
    assert Profile.params == [*expected, list(profile.impls())]
    assert profile.impls()[:3] == ("tc", "flash", "tc_mma")
    assert Profile.param_names == ["heads", "q_len", "prefix_len", "impl"]  # Quick's: the landing page joins them


# ---------------------------------------------------------------------------------------
# Recorded series: never judged (benchmarks/accepted.json, report), shown on the landing page.

PROFILE_PARAMS = [["64"], ["9"], ["65536"], ["'tc'", "'flash'", "'tc_mma'"]]


def add_profile(results, machine: str, commit: str, series: dict, date: int = 1):
    """Profile series {name: [tc, flash, tc_mma]} added to commit's results file (made if absent),
    through asv's own API."""
    from asv import results as asv_results, runner

    (results / machine).mkdir(parents=True, exist_ok=True)
    (results / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    found = sorted((results / machine).glob(f"{commit[:8]}-*.json"))
    res = (asv_results.Results.load(str(found[0]), machine_name=machine) if found else
           asv_results.Results({"machine": machine}, {}, commit, date, "3.12", "reuse-py3.12", {}))
    for name, values in series.items():
        res.add_result({"name": f"bench_profile.Profile.{name}", "params": PROFILE_PARAMS, "version": "1"},
                       runner.BenchmarkResult(values, [None] * 3, [None] * 3, 0, "", None))
    res.save(str(results))


def test_accepted_json_takes_every_profile_series_off_the_judged_list():
    from benchmarks.bench_profile import Profile
    from verify_attn_tools import regressions

    patterns = regressions.not_judged(regressions.Path(__file__).resolve().parent.parent)
    tracks = [m for m in dir(Profile) if m.startswith("track_")]
    assert len(tracks) == len(profile.STALLS) + 11
    for m in tracks:  # as asv names an entry: parameters as stored, then the branch
        assert any(p.match(f"bench_profile.Profile.{m}(64, 9, 65536, 'tc')@main") for p in patterns), m
    assert not any(p.match("bench_verify_attn.Quick.track_time_vs_anchor(64, 9, 65536, 'tc')@main") for p in patterns)


def test_report_leaves_the_profile_out_of_its_verdict(tmp_path, capsys):
    import test_report

    from verify_attn_tools import report

    a, b = test_report.commits()
    test_report.write(tmp_path, "nvidia-h200", a, test_report.BASE)
    test_report.write(tmp_path, "nvidia-h200", b, test_report.BASE)
    add_profile(tmp_path, "nvidia-h200", a, {"track_dram_gbps": [3000.0, 900.0, 2000.0], "track_registers": [168, 96, 255]})
    add_profile(tmp_path, "nvidia-h200", b, {"track_dram_gbps": [300.0, 90.0, 200.0], "track_registers": [255, 255, 255]})
    assert report.main([a, b, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "**no significant change**" in out.splitlines()[0] and "Profile" not in out
    # The same run judges a Quick slowdown: the verdict above is not blind.
    test_report.write(tmp_path, "nvidia-h200", b, {**test_report.BASE, (65536, "tc"): 3.3e-4 * 1.1})
    assert report.main([a, b, "--results", str(tmp_path)]) == 1


def quick_times(results, machine, commit, date):
    """Quick's times at its headline point (tc, flash, tc_mma), what the landing page's rows need."""
    from asv import results as asv_results, runner

    (results / machine).mkdir(parents=True, exist_ok=True)
    (results / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    res = asv_results.Results({"machine": machine}, {}, commit, date, "3.12", "reuse-py3.12", {})
    res.add_result({"name": "bench_verify_attn.Quick.track_time", "params": PROFILE_PARAMS, "version": "2"},
                   runner.BenchmarkResult([1.3e-4, 5.8e-3, 2.0e-4], [None] * 3, [None] * 3, 0, "", None))
    res.save(str(results))


PROFILED = {"track_dram_gbps": [3050.0, 400.0, 2100.0], "track_dram_pct": [73.0, 9.6, 50.0],
            "track_tensor_pipe_pct": [41.0, 0.0, 30.0], "track_occupancy_pct": [12.0, 40.0, 12.0],
            "track_issue_pct": [20.0, 60.0, 25.0], "track_registers": [168, 64, 255],
            "track_dynamic_smem_bytes": [120832, 0, 98304], "track_kernels": [2, 2, 1],
            "track_stall_long_scoreboard": [1.9, 3.0, 0.4], "track_stall_barrier": [0.5, 0.2, 2.0],
            "track_sm_tail": [1.14, 1.01, 1.05]}


def landing_html(results, tmp_path) -> str:
    from verify_attn_tools import landing

    return landing.build(results, tmp_path / "index.html").read_text()


def test_landing_without_profile_series_says_so(tmp_path):
    results = tmp_path / "results"
    quick_times(results, "nvidia-h200", "a" * 40, 1000)
    quick_times(results, "nvidia-h200", "b" * 40, 2000)
    html = landing_html(results, tmp_path)
    assert "bench_profile.Profile): not profiled at this commit." in html
    assert "hardware (ncu)" not in html and '<tr id="nvidia-h200-Quick-h64-q9-p65536-tc"' in html


def test_landing_shows_the_hardware_view_and_what_moved(tmp_path):
    results = tmp_path / "results"
    quick_times(results, "nvidia-h200", "a" * 40, 1000)
    add_profile(results, "nvidia-h200", "a" * 40, PROFILED)
    quick_times(results, "nvidia-h200", "b" * 40, 2000)
    after = {**PROFILED, "track_registers": [176, 64, 255], "track_dram_gbps": [3200.0, 402.0, 2100.0],
             "track_stall_barrier": [0.5, 0.2, 0.1], "track_tensor_pipe_pct": [41.5, 0.0, 30.0],
             "track_sm_tail": [1.07, 1.02, 1.05]}
    add_profile(results, "nvidia-h200", "b" * 40, after)
    html = landing_html(results, tmp_path)
    assert "not profiled at this commit" not in html
    rows = [line for line in html.splitlines() if line.startswith('<tr class="hw">')]
    assert len(rows) == 3  # tc, tc_mma, flash at Quick's headline point
    tc = rows[0]
    assert ("hardware (ncu): DRAM 3,200 GB/s (73% of peak); tensor pipe 42%; issue slots 20%; occupancy 12%; "
            "176 registers; 118 KiB dynamic smem; SM tail 1.07x; top stall long scoreboard "
            "(1.90 warps/issue).") in tc
    # tensor pipe +0.5 points: unnamed
    assert "Since aaaaaaaa: DRAM 3,050→3,200 GB/s (+4.9%), registers 168→176, SM tail 1.14→1.07x" in tc
    mma = next(r for r in rows if "255 registers" in r)
    assert "Since aaaaaaaa: top stall barrier→long scoreboard" in mma
    flash = next(r for r in rows if "64 registers" in r)
    assert "Nothing moved since aaaaaaaa" in flash  # 400 -> 402 GB/s is under 3%, the busiest SM 1.01 -> 1.02 under 0.02


def test_landing_when_the_previous_commit_has_no_profile(tmp_path):
    results = tmp_path / "results"
    quick_times(results, "nvidia-h200", "a" * 40, 1000)
    quick_times(results, "nvidia-h200", "b" * 40, 2000)
    add_profile(results, "nvidia-h200", "b" * 40, PROFILED)
    html = landing_html(results, tmp_path)
    assert html.count("No profile at aaaaaaaa") == 3


def test_the_query_as_a_table_decides_what_is_asked(stand_in, capsys):
    state, configure = stand_in
    offered = sorted({n.split(".")[0] for names in profile.candidates().values() for n in names}
                     - {"sm__pipe_tensor_cycles_active", "dram__throughput"})
    configure(no_csv_query=True, offered=offered)
    result = profile.run([(64, 9, 65536)])
    (args,) = [a for a in calls_of(state) if "--export" in a]
    asked = args[args.index("--metrics") + 1].split(",")
    assert "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed" in asked and M["dram_pct"] not in asked
    assert M["pipe_tensor"] not in asked and M["pipe_gmma"] in asked and "launch__registers_per_thread" in asked
    assert "pipe_tensor" in result["missing"] and result["metrics"]["registers"] == "launch__registers_per_thread"
    assert "dram_pct" in result["missing"]  # the sample export has the first candidate's column, not this one
    assert f"ncu offers none of {M['pipe_tensor']} on this device: no pipe_tensor series" in capsys.readouterr().err


def test_the_command_line_prints_a_table_and_writes_json(stand_in, tmp_path, capsys):
    assert profile.main(["--points", "64:9:65536", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    tc = next(line for line in out if line.startswith("h64 q9 p65536 tc "))
    assert "tc_attn_wg+tc_merge" in tc and tc.endswith("long_scoreboard")
    assert out[-1].startswith("2 calls in ") and "passes a launch [8, 9]" in out[-1]
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["points"]["64:9:65536:tc"]["registers"] == 168


def test_the_command_line_takes_a_variant_and_a_peer(stand_in, capsys):
    state, _ = stand_in
    assert profile.main(["--variant", "chain", "--points", "8:9:65536,16:9:65536", "--impls", "tc,flashmla"]) == 0
    (args,) = [a for a in calls_of(state) if "--export" in a]
    target = args[args.index("--force-overwrite") + 1:]
    assert target[target.index("--variant") + 1] == "chain"
    assert target[target.index("--points") + 1] == "8:9:65536,16:9:65536"
    assert target[target.index("--impls") + 1] == "tc,flashmla"
    # Quick's by default: the asv class's profile is unchanged.
    profile.run([(64, 9, 65536)])
    last = [a for a in calls_of(state) if "--export" in a][-1]
    assert last[last.index("--variant") + 1] == "quick" and "flashmla" not in last[last.index("--impls") + 1]


@pytest.mark.parametrize("argv, said", [
    (["--variant", "nope"], "--variant: invalid choice: 'nope'"),
    (["--points", "64:9"], "--points '64:9': three integers a point"),
    (["--points", "64:9:x"], "--points '64:9:x': give H:Q:P"),
    (["--impls", "tc,fastmla"], "--impls: fastmla not in the registry"),
])
def test_bad_arguments_are_one_line_naming_the_argument(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        profile.main(argv)
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_a_serving_point_reads_as_batch_heads_q_len():
    calls, _ = profile.attribute(ncu.parse_raw(export()), ncu.parse_raw(export(renamed=True)))
    points = {k: profile.summarise(v, M) for k, v in calls.items()}
    rows = profile.table({"variant": "serving_chain", "points": points}).splitlines()
    assert rows[1].startswith("b64 h9 q65536 tc ")  # (batch, heads, q_len) of the serving variants
    assert profile.table({"variant": "chain", "points": points}).splitlines()[1].startswith("h64 q9 p65536 tc ")


def test_the_command_line_without_ncu_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ncu, "find", lambda: (_ for _ in ()).throw(ncu.NcuError("ncu (Nsight Compute) not found")))
    assert profile.main(["--points", "64:9:65536"]) == 1
    assert capsys.readouterr().err == "python -m verify_attn.profile: ncu (Nsight Compute) not found\n"
