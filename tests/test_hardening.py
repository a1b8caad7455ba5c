"""Issue 18, items 3-5: markup neutralized at the boundaries (the PR comment, the published
site), clear errors instead of silent passes or tracebacks (malformed results, crafted
bundles, nothing checked or timed), and interrupted verbs that leave no process or clone."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from verify_attn import cases
from verify_attn_tools import check, publish, report, sanitize
from verify_attn_tools.children import descendants

ROOT = Path(__file__).resolve().parent.parent
CRAFTED = "@alice [click](https://evil.example) ![x](https://evil.example/p.png) <!-- hide | <img src=x onerror=alert(1)> &#64;bob"


# --- 3b: the PR comment -------------------------------------------------------------------


def assert_inert(text: str) -> None:
    assert "<!--" not in text and "<img" not in text
    assert "@alice" not in text and "@bob" not in text and "&#64;bob" not in text.replace("&amp;#64;", "")
    assert "](" not in text.replace("&#93;(", "") and "[click" not in text


def test_sanitize_neutralizes_mentions_comments_tags_and_links():
    report_md = ("### verify-attn a → b: **slower** (p < 0.002)\n\n| case | impl |\n| --- | --- |\n"
                 f"| Quick h64 | {CRAFTED} |\n\n<details><summary>3 unchanged</summary>\n\n| a | b |\n</details>\n"
                 "<sub>exit 1</sub>\n")
    safe = sanitize.sanitize(report_md)
    assert_inert(safe)
    assert "@\u200dalice" in safe and "&lt;!-- hide" in safe and "&#91;click&#93;" in safe
    # The report's own structure stays: tables, bold, folding, the exit line.
    for kept in ("| case | impl |", "| --- | --- |", "**slower**", "<details><summary>3 unchanged</summary>",
                 "</details>", "<sub>exit 1</sub>", "→"):
        assert kept in safe
    assert sanitize.sanitize(safe) == safe  # idempotent
    # The script: stdlib only (-I: no site-packages, no checkout on the path), stdin to stdout.
    proc = subprocess.run([sys.executable, "-I", str(ROOT / "verify_attn_tools" / "sanitize.py")], input=report_md,
                          capture_output=True, text=True, check=True)
    assert proc.stdout == safe


def test_cell_escapes_names_from_results_and_keeps_plain_ones():
    for plain in ("tc_mma", "Quick h64 q9 p65536", "flash", "nvidia-h200"):
        assert sanitize.cell(plain) == plain
    out = sanitize.cell(CRAFTED + "\nnext | line")
    assert_inert(out)
    assert "\n" not in out and "|" not in out


def crafted_results(path: Path, a: str, b: str) -> None:
    """Two commits' results whose tc is renamed CRAFTED in b (a results file from a pull request)."""
    import test_report

    test_report.write(path, "nvidia-h200", a, test_report.BASE)
    test_report.write(path, "nvidia-h200", b, {**test_report.BASE, (65536, "flash"): 6e-3 * 1.10},
                      failed=[(2048, "tc")], failed_cases=[("ragged_3x16x9", "tc")])
    f = next((path / "nvidia-h200").glob(f"{b[:8]}-*.json"))
    data = json.loads(f.read_text())
    for row in data["results"].values():
        row[1] = [[repr(CRAFTED) if v == "'tc'" else v for v in axis] for axis in row[1]]
    f.write_text(json.dumps(data))


def test_report_escapes_names_from_results_files(tmp_path, capsys):
    a, b = report_commits()
    crafted_results(tmp_path, a, b)
    code = report.main([a, b, "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2 and out.count("\n") > 5
    assert_inert(out)
    assert "@\u200dalice" in out and "&lt;!-- hide" in out


def test_ab_escapes_names_in_its_markdown():
    from verify_attn_tools import ab

    rows = [ab.Row("h64 q9 p2048", CRAFTED, "new", reason=CRAFTED),
            ab.Row("h64 q9 p2048", "flash", "same", 1e-4, 1e-4, 1.0, 10, 20, 1.0)]
    text = ab.markdown(rows, "aaaa", "bbbb", "cpu", 1.01, [f"{CRAFTED} on case"])
    assert_inert(text)


def report_commits():
    import test_report

    return test_report.commits()


# --- 3a: the published site ---------------------------------------------------------------


def fake_asv(index: dict):
    def call(cmd, cwd):
        html = Path(json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())["html_dir"])
        html.mkdir(parents=True, exist_ok=True)
        (html / "index.html").write_text('<html><head></head><body><ul id="nav"></ul></body></html>')
        (html / "index.json").write_text(json.dumps(index))
        return 0
    return call


def test_publish_escapes_tags_and_benchmark_names(tmp_path, monkeypatch):
    import shutil

    tag, pretty = "<img/src='x'/onerror=alert(1)>", "Quick <script>alert(1)</script>"
    index = {"benchmarks": {"bench_verify_attn.Quick.track_time": {
        "name": "bench_verify_attn.Quick.track_time", "pretty_name": pretty, "code": "if a < b: pass",
        "unit": "seconds", "param_names": ["heads", "impl"]}},
        "graph_param_list": [], "tags": {tag: 3, "v1.0": 5},
        "machines": {"m": {"machine": "m", "cpu": "<b onmouseover=alert(1)>x</b>"}}}
    monkeypatch.setattr(publish.subprocess, "call", fake_asv(index))
    shutil.copy(ROOT / "asv.conf.json", tmp_path)
    recorded = tmp_path / "results" / "nvidia-h200"  # publish refuses to run before any results
    recorded.mkdir(parents=True)
    shutil.copy(ROOT / "results" / "benchmarks.json", tmp_path / "results")
    for name in ("machine.json", "129ebaf7-reuse-py3.12.json"):
        shutil.copy(ROOT / "results" / "nvidia-h200" / name, recorded)
    assert publish.publish(tmp_path) == 0
    text = (tmp_path / "html" / "index.json").read_text()
    assert "<" not in text and ">" not in text
    got = json.loads(text)
    assert set(got["tags"]) == {"&lt;img/src='x'/onerror=alert(1)&gt;", "v1.0"}
    bm = got["benchmarks"]["bench_verify_attn.Quick.track_time"]
    assert bm["pretty_name"] == "Quick &lt;script&gt;alert(1)&lt;/script&gt;" and bm["unit"] == "seconds"
    assert bm["code"] == "if a &lt; b: pass"
    assert not list((tmp_path / ".asv").glob("publish-*"))  # the staging directory is gone

    # A name that is also a file path and a URL fragment: refused in one line, html/ kept.
    before = (tmp_path / "html" / "index.json").read_text()
    index["benchmarks"] = {"x.<svg onload=alert(1)>": {"name": "x", "param_names": []}}
    monkeypatch.setattr(publish.subprocess, "call", fake_asv(index))
    assert publish.publish(tmp_path) == 1
    assert (tmp_path / "html" / "index.json").read_text() == before


# --- 4: clear errors, never silence -------------------------------------------------------


def malformed(path: Path, how: str) -> Path:
    import test_report

    a, b = report_commits()
    test_report.write(path, "nvidia-h200", a, test_report.BASE)
    test_report.write(path, "nvidia-h200", b, test_report.BASE)
    f = next((path / "nvidia-h200").glob(f"{b[:8]}-*.json"))
    data = json.loads(f.read_text())
    if how == "literal":
        next(iter(data["results"].values()))[1][0][0] = "__import__('os').getcwd()"
    else:
        data["results"] = None
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize("how, field", [("literal", ".params"), ("null", "field results:")])
def test_malformed_results_end_report_in_one_line(tmp_path, capsys, how, field):
    f = malformed(tmp_path, how)
    a, b = report_commits()
    assert report.main([a, b, "--results", str(tmp_path)]) == report.MALFORMED_EXIT == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(f) in err[0] and field in err[0], err


@pytest.mark.parametrize("how", ["literal", "null"])
def test_malformed_results_end_publish_before_html_is_touched(tmp_path, capsys, monkeypatch, how):
    import shutil

    shutil.copy(ROOT / "asv.conf.json", tmp_path)
    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "index.html").write_text("the previous site")
    f = malformed(tmp_path / "results", how)
    monkeypatch.setattr(publish.subprocess, "call", lambda *a, **k: pytest.fail("asv publish ran"))
    assert publish.publish(tmp_path) == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and str(f) in err[0] and "field" in err[0]
    assert [p.name for p in (tmp_path / "html").iterdir()] == ["index.html"]
    assert (tmp_path / "html" / "index.html").read_text() == "the previous site"


def test_plots_survive_a_run_that_does_not_load(tmp_path, caplog):
    from verify_attn_tools import plots

    malformed(tmp_path / "results", "literal")
    plots.main(tmp_path / "results", tmp_path / "plots")
    assert "results do not load" in (tmp_path / "plots" / "index.html").read_text()


@pytest.mark.parametrize("argv, name, flag", [(["--impl", "naive", "tc_mma"], "tc_mma", "--impl"),
                                              (["--case", "seed_2x8x9x9", "ragged_3x16x9"], "ragged_3x16x9", "--case")])
def test_check_names_a_second_name_given_as_a_bundle_file(capsys, argv, name, flag):
    """`check --impl a b` reads b as a bundle file to replay; it exits 2 naming b and the flag
    to repeat, before anything is checked, rather than failing to load a file named b."""
    with pytest.raises(SystemExit) as exc:
        check.main(["--device", "cpu", *argv])
    err = capsys.readouterr()
    assert exc.value.code == 2 and not err.out
    assert f"'{name}' is a name for {flag}, not a bundle file" in err.err and f"{flag} NAME1 {flag} NAME2" in err.err


def test_check_fails_when_nothing_was_checked(capsys):
    assert check.main(["--device", "cpu", "--impl", "tc", "--case", "ragged_3x16x9"]) == 1
    out = capsys.readouterr().out
    assert "SKIP" in out and "FAIL nothing checked" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case: tc has nothing to time here")
def test_ab_refuses_when_nothing_can_be_timed(capsys):
    from verify_attn_tools import ab

    assert ab.main(["HEAD", "--impl", "tc"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "nothing to time on cpu" in err[0]


def crafted_bundle(kind: str) -> cases.Inputs:
    i = dataclasses.replace(cases.make_inputs(cases.CASES["paged_2x16x17"], seed=5))
    if kind == "index":
        i.kv_indices = i.kv_indices.clone()
        i.kv_indices[0, 0] = 10**9
    elif kind == "parent":
        i.parent = i.parent.clone()
        i.parent[0, 3] = 7
    elif kind == "prefix":
        i.prefix_lens = i.prefix_lens.clone()
        i.prefix_lens[0] = 10**6
    elif kind == "last_dim":
        i.q = i.q[..., :500].contiguous()
    elif kind == "q_dims":
        i.q = i.q[0].contiguous()
    return i


@pytest.mark.parametrize("kind, message", [("index", "kv_indices"), ("parent", "parent"), ("prefix", "prefix_lens"),
                                           ("last_dim", "q"), ("q_dims", "q must be")])
def test_crafted_bundles_fail_the_ops_checks_before_the_reference(tmp_path, capsys, monkeypatch, kind, message):
    from verify_attn import candidate

    path = tmp_path / f"{kind}.pt"
    cases.save_bundle(crafted_bundle(kind), path)
    monkeypatch.setattr(candidate, "reference_of", lambda *a: pytest.fail("the reference ran"))
    assert check.main(["--device", "cpu", "--impl", "naive", str(path)]) == 1
    lines = [l for l in capsys.readouterr().out.splitlines() if not l.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith(f"FAIL load {path}: ") and message in lines[0], lines


# --- 5: interrupted verbs leave no child and no clone ---------------------------------------


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def cmdline(pid: int) -> list[bytes]:
    """pid's argv, or [] once it has exited (a short-lived child may go between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def interrupt(tmp_path: Path, patch: str, argv: list[str], sig=signal.SIGTERM, grandchild=False) -> tuple[int, str]:
    """Run `python -m verify_attn ARGV` with PATCH applied first (a command replaced by a long
    sleep), wait for the sleep, send sig to the verb's process alone; assert the sleep is gone and
    the verb's temp dir is empty. Returns (exit code, stderr)."""
    secs = random.randrange(600000, 700000)  # a sleep of our own to look for
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    driver = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nSLEEP = {secs}\n" + textwrap.dedent(patch)
              + f"\nfrom verify_attn_tools import cli\nsys.exit(cli.main({argv!r}))\n")
    from verify_attn import build

    # A HOME of its own (asv's machine file), the session's build cache (the extension built once);
    # the inherited PYTHONPATH stays behind ROOT (a GPU box may bring asv as --target wheels).
    env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               VERIFY_ATTN_CACHE=str(build.cache_dir()))
    (tmp_path / "home").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sleeps = []
    try:
        deadline = time.monotonic() + 120
        while not sleeps and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            sleeps = [p for p in descendants(proc.pid) if cmdline(p)[:2] == [b"sleep", str(secs).encode()]]
        assert sleeps, f"the sleep never started: {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        time.sleep(0.5)
        assert not [p for p in sleeps if alive(p)], f"orphans left: {sleeps}\n{err}"
        assert list(tmp.iterdir()) == [], f"left in the temp dir: {list(tmp.iterdir())}"
        return proc.returncode, err
    finally:
        for p in sleeps:  # only what this test started
            if alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_interrupted_backfill_ends_its_shards_and_removes_its_clones(tmp_path):
    code, err = interrupt(tmp_path, """
        from verify_attn_tools import backfill
        backfill.shard_script = lambda mine, machine, bench, fresh=False: f"sleep {SLEEP}; true"
        """, ["backfill", "0", "HEAD"])
    assert code == 130, err


def test_interrupted_run_ends_asvs_process_group(tmp_path):
    code, err = interrupt(tmp_path, """
        import os
        os.environ["VERIFY_ATTN_CACHE"] = os.path.join(os.environ["TMPDIR"], "..", "cache")
        from verify_attn_tools import run
        run.ASV = ["bash", "-c", f"sleep {SLEEP}; true", "--"]
        """, ["run", "--no-publish"], sig=signal.SIGINT)
    assert code == 130, err


def test_interrupted_detect_ends_its_runs_and_removes_its_clones(tmp_path):
    code, err = interrupt(tmp_path, """
        from verify_attn_tools import detect
        detect.AB = ["bash", "-c", f"sleep {SLEEP}; true", "--"]
        """, ["detect", "--sizes", "0x1"])
    assert code == 130, err


def test_interrupted_ab_ends_what_its_build_started(tmp_path):
    # The base's build (torch's ninja, nvcc) runs in ab's own process group: a grandchild here.
    code, err = interrupt(tmp_path, """
        import subprocess
        from verify_attn import revision
        def library(*a):
            subprocess.run(["bash", "-c", f"sleep {SLEEP}; true"])
        revision.library = library
        """, ["ab", "HEAD", "--impl", "flash"])
    assert code == 130, err


def test_ending_the_children_ends_what_left_their_group():
    """asv's forkserver starts a session of its own: ending asv's group alone left it running."""
    from verify_attn_tools.children import Children

    kids = Children()
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
            "print(p.pid, flush=True); time.sleep(120)")
    parent = kids.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    escaped = int(parent.stdout.readline())
    assert os.getpgid(escaped) != os.getpgid(parent.pid)
    kids.end(grace=5)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{escaped}") and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = not os.path.exists(f"/proc/{escaped}")
    if not gone:
        os.kill(escaped, signal.SIGKILL)
    assert gone, "the process in a session of its own outlived end()"


def test_a_verb_piped_into_head_stops_quietly():
    """`python -m verify_attn VERB | head`: the reader leaves early, the verb ends with SIGPIPE's
    status and no traceback (its output is a real verb's: resources' rows, printed many times)."""
    driver = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
              "from verify_attn_tools import cli, resources\n"
              "rows = {'sm_90': {'k.cu': {f'k{i}': dict(registers=1, smem=0, stack=0, spill_stores=0, spill_loads=0,"
              " threads=32, blocks_per_sm=1, occupancy=1.0) for i in range(50000)}}}\n"
              "resources.resources.report = lambda: rows\n"
              "sys.exit(cli.main(['resources']))\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert first.startswith(b"static smem only") and "Traceback" not in err, err
