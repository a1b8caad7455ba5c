"""`python -m verify_attn run`'s output: terse by default (a line per benchmark class and
set-up with its time, the suite's progress lines, failures in full, a summary), asv's
complete output in .asv/logs/run-<date>.log (git-ignored), all of it on the terminal with
--verbose; asv's exit code kept. asv is played by a script that logs through asv's own
console (asv.console.log, asv_runner.console.Log), so its records end as asv's do: without a newline until the
next one begins."""

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from verify_attn_tools import run

ROOT = Path(__file__).resolve().parent.parent

# What an H200 run prints, in small: the GPU's machine series, a set-up that builds (slow, with
# a progress line meanwhile), a class whose tables are mostly n/a cells, a benchmark failing on
# some points (its table, then its traceback), one failing outright, a name asv cuts short.
FAKE_ASV = r'''
import os, sys, time
from asv.console import log

SLOW = float(os.environ.get("FAKE_ASV_SLOW", "1.5"))
log.enable()
log.info("Creating environments")
log.info("Discovering benchmarks")
with log.indent():
    log.info("Building 1234abcd <main> for reuse-py3.11")
log.info("Running 9 total benchmarks (1 commits * 1 environments * 9 benchmarks)")
log.set_nitems(9)
log.info("For verify-attn commit 1234abcd <main>:")


def result(name, status, details=None):
    log.step()
    log.info(name, reserve_space=True)
    log.add_padded(status)
    if details:
        log.info(details, color="default")


def table(rows):
    cells = "\n".join(f"   {impl:>8}   {value:>10}" for impl, value in rows)
    return f"========== ==========\n   impl       value\n---------- ----------\n{cells}\n========== ==========\n"


with log.indent():
    log.info("Benchmarking reuse-py3.11")
    with log.indent():
        result("bench_machine.Gpu.track_sm_count", "132")
        result("bench_machine.Gpu.track_power_limit", "n/a")
        log.info("Setting up bench_verify_attn:96", reserve_space=True)
        with open(os.path.join(os.environ["VERIFY_ATTN_CACHE"], "progress.log"), "a") as f:
            f.write("[verify_attn] building the extension (fake)\n")
        time.sleep(SLOW)
        log.add_padded("ok")
        na = [(f"impl{i}", "n/a") for i in range(40)]
        result("bench_verify_attn.Chain.track_time", "ok", table([("tc", "1.0e-05")] + na))
        result("bench_verify_attn.Chain.track_error", "ok", table([("tc", "0.001")] + na))
        result("bench_verify_attn.Quick.track_time", "2/41 failed",
               table([("tc", "failed"), ("naive", "failed")] + na)
               + "\nTraceback (most recent call last):\n  File \"bench.py\", line 1\nRuntimeError: tc disagrees "
                 "with the reference at heads 64")
        result("bench_verify_attn.Quick.track_plan_keys_per_tile_and_a_very_long_name_that_asv_cuts_short",
               "ok", table([("tc", "64")] + na))
        result("bench_verify_attn.Serving.track_time", "failed")
        result("bench_verify_attn.Serving.track_error", "ok", table([("tc", "0.002")] + na))
        result("bench_verify_attn.Serving.track_bytes", "ok", table([("tc", "4096")] + na))
sys.exit(int(os.environ.get("FAKE_ASV_EXIT", "2")))
'''


def driver(tmp: Path, *argv: str) -> str:
    """python -c source: `python -m verify_attn run ARGV` with asv played by FAKE_ASV and the log in tmp/logs."""
    fake = tmp / "fake_asv.py"
    fake.write_text(FAKE_ASV)
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from verify_attn_tools import cli, run
        run.ASV = [sys.executable, {str(fake)!r}]
        run.LOGS = Path({str(tmp / "logs")!r})
        run.relay.__defaults__ = (0.5,)  # a record under way for 0.5 s is announced (3 s in use)
        sys.exit(cli.main(["run", "--no-publish", "--track", *{list(argv)!r}]))
        """)


def environment(tmp: Path) -> dict:
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "cache").mkdir(exist_ok=True)
    # No real builds beside the fake asv (test_a_whole_run_starts_the_builds_first checks that they start).
    return dict(os.environ, HOME=str(tmp / "home"), VERIFY_ATTN_CACHE=str(tmp / "cache"), VERIFY_ATTN_DEVICE="cpu",
                COLUMNS="100", PYTHONPATH=str(ROOT), VERIFY_ATTN_PREBUILD="0")


def verb(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", driver(tmp, *argv)], cwd=ROOT, env=environment(tmp),
                          capture_output=True, text=True, timeout=120)


def asv_alone(tmp: Path) -> str:
    """What the fake asv writes when nobody reads it line by line: the log's reference."""
    proc = subprocess.run([sys.executable, str(tmp / "fake_asv.py")], env=dict(environment(tmp), FAKE_ASV_SLOW="0"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "", proc.stderr
    return proc.stdout


def the_log(tmp: Path) -> Path:
    (log,) = (tmp / "logs").glob("run-*.log")
    assert re.fullmatch(r"run-\d{8}-\d{6}\.log", log.name), log.name
    return log


def test_default_output_is_terse_and_says_where_the_whole_log_is(tmp_path):
    proc = verb(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # asv's exit code, unchanged
    out = proc.stdout
    lines = out.splitlines()
    # The outline, one line per class and set-up with its counts and time, the progress line.
    assert "· Creating environments" in lines and "·· Building 1234abcd <main> for reuse-py3.11" in lines
    assert any(re.fullmatch(r"\[ ?\d+\.\d\d%\] bench_machine\.Gpu: 1 ok, 1 n/a \(\d+\.\d s\)", x) for x in lines), out
    assert any(re.fullmatch(r"\[ ?\d+\.\d\d%\] set-up bench_verify_attn:96: ok \((1\.[5-9]|[2-9]\.\d) s\)", x)
               for x in lines), out
    assert any(re.fullmatch(r"\[ ?\d+\.\d\d%\] bench_verify_attn\.Chain: 2 ok \(\d+\.\d s\)", x) for x in lines), out
    assert any(re.fullmatch(r"\[ ?\d+\.\d\d%\] bench_verify_attn\.Quick: 1 ok, 1 failed \(\d+\.\d s\)", x)
               for x in lines), out
    assert any(re.fullmatch(r"\[ ?\d+\.\d\d%\] bench_verify_attn\.Serving: 2 ok, 1 failed \(\d+\.\d s\)", x)
               for x in lines), out
    assert "[verify_attn] building the extension (fake)" in lines
    # The slow set-up was announced while it ran, before its line with the time.
    started = next(i for i, x in enumerate(lines) if x.endswith("set-up bench_verify_attn:96 ..."))
    ended = next(i for i, x in enumerate(lines) if x.startswith("[") and "set-up bench_verify_attn:96: ok" in x)
    assert started < ended, out
    # Failures in full: the partly failed benchmark's line, its table and traceback; the other's line.
    assert "RuntimeError: tc disagrees with the reference at heads 64" in out
    assert any("bench_verify_attn.Quick.track_time" in x and x.endswith("2/41 failed") for x in lines), out
    assert any("bench_verify_attn.Serving.track_time" in x and x.endswith(" failed") for x in lines), out
    # No table of a benchmark that passed, and so few n/a cells: those of the failed one only.
    assert "0.002" not in out and "4096" not in out and "1.0e-05" not in out
    assert out.count("n/a") == 40 + 2, out  # the failed one's 40 cells, Gpu's line and the summary
    # The summary, then where asv's complete output is.
    assert any(x.startswith("benchmarks: 6 ok, 1 n/a, 2 failed; asv exited 2 after ") for x in lines), out
    assert "  failed: bench_verify_attn.Quick.track_time (2/41 failed)" in lines
    assert "  failed: bench_verify_attn.Serving.track_time (failed)" in lines
    assert len(lines) < 70, out
    log = the_log(tmp_path)
    assert proc.stderr.strip().splitlines()[-1] == f"asv's complete output: {log}", proc.stderr


def test_the_log_holds_asvs_whole_output_and_the_progress_lines(tmp_path):
    proc = verb(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = the_log(tmp_path).read_text()
    head, *body, foot = text.splitlines(keepends=True)
    assert head.startswith("# ") and " run --machine " in head and "--record-samples" in head
    assert foot == "# asv exited 2\n"
    progress = "[verify_attn] building the extension (fake)\n"
    assert body.count(progress) == 1
    # Byte for byte what asv wrote, the progress line put in between two of its lines.
    alone = asv_alone(tmp_path)  # the footer starts a line of its own
    assert "".join(x for x in body if x != progress) == alone + ("" if alone.endswith("\n") else "\n")
    assert text.count("n/a") > 200 and "0.002" in text and "4096" in text


def test_verbose_shows_asvs_whole_output(tmp_path):
    proc = verb(tmp_path, "--verbose")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == asv_alone(tmp_path)  # as it came, nothing left out or added
    assert "[verify_attn] building the extension (fake)" in proc.stderr  # as before: followed on stderr
    assert "benchmarks:" not in proc.stdout
    log = the_log(tmp_path)
    assert log.read_text().count("0.002") == 1  # the log is kept with --verbose too
    assert proc.stderr.strip().splitlines()[-1] == f"asv's complete output: {log}"


def test_a_passing_run_exits_0(tmp_path):
    proc = subprocess.run([sys.executable, "-c", driver(tmp_path)], cwd=ROOT,
                          env=dict(environment(tmp_path), FAKE_ASV_EXIT="0", FAKE_ASV_SLOW="0"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "asv exited 0 after" in proc.stdout


def test_a_whole_run_starts_the_builds_first(tmp_path):
    """A run of the whole suite over the checkout starts every build before asv (through the
    verb's tracked process groups); one with -b, or over other commits, leaves them to the
    benchmarks that need them."""
    record = tmp_path / "started.txt"
    hook = (f"import verify_attn.prebuild as pb\n"
            f"def fake(needs=pb.WHAT, popen=None):\n"
            f"    open({str(record)!r}, 'a').write(','.join(needs) + ' ' + popen.__qualname__ + '\\n')\n"
            f"    return []\n"
            f"run.prebuild.start = fake\n"
            f"run.checkout_measured = lambda r: r == ['HEAD^!']\n")  # the test's checkout may be dirty
    for argv, expected in (((), "extension,anchor,flashmla,resources Children.popen\n"), (("-b", "Quick"), None),
                           (("HEAD~1..HEAD",), None)):
        record.unlink(missing_ok=True)
        source = driver(tmp_path, *argv).replace("run.LOGS =", hook + "run.LOGS =")
        proc = subprocess.run([sys.executable, "-c", source], cwd=ROOT, env=dict(environment(tmp_path), FAKE_ASV_SLOW="0"),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert (record.read_text() if record.exists() else None) == expected, argv
    assert run.checkout_measured(["HEAD~1..HEAD"]) is False


def test_the_logs_are_git_ignored():
    probe = run.LOGS / "run-20260101-000000.log"
    assert probe.relative_to(ROOT).parts[:2] == (".asv", "logs")
    assert not {"results", "html"} & set(probe.relative_to(ROOT).parts)
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
    assert ignored.returncode == 0, f"{probe} is not git-ignored"


def test_terse_keeps_unknown_lines_and_drops_tables():
    """Lines that are not asv's log (asv's own traceback) are shown; a passing table is not."""
    said = []
    t = run.Terse(say=said.append, clock=iter(range(100)).__next__)
    for line in ["[ 10.00%] ··· bench_verify_attn.Chain.track_time                 ok",
                 "[ 10.00%] ··· ======= =====", "              impl    tc", "              ======= =====", "",
                 "Traceback (most recent call last):", '  File "asv/main.py", line 1', "OSError: disk full"]:
        t.feed(line + "\n")
    t.close(1)
    assert said[:3] == ["Traceback (most recent call last):", '  File "asv/main.py", line 1', "OSError: disk full"]
    assert re.fullmatch(r"\[10\.00%\] bench_verify_attn\.Chain: 1 ok \(\d+\.\d s\)", said[3]), said
    assert said[4].startswith("benchmarks: 1 ok; asv exited 1 after") and len(said) == 5, said


def test_an_interrupted_run_ends_asv_and_still_names_its_log(tmp_path):
    from test_hardening import interrupt

    code, err = interrupt(tmp_path, """
        import os
        from pathlib import Path
        os.environ["VERIFY_ATTN_CACHE"] = os.path.join(os.environ["TMPDIR"], "..", "cache")
        from verify_attn_tools import run
        run.ASV = ["bash", "-c", f"echo '· Creating environments'; sleep {SLEEP}; true", "--"]
        run.LOGS = Path(os.environ["TMPDIR"]).parent / "logs"
        """, ["run", "--no-publish"], sig=signal.SIGINT)
    assert code == 130, err
    log = the_log(tmp_path)
    assert err.strip().splitlines()[-1] == f"asv's complete output: {log}", err
    assert log.read_text().splitlines()[1:] == ["· Creating environments", "# interrupted"]
