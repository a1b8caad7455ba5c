"""The pull-request check gates on every named case: a kernel break that shows only on a
prefix that is not a multiple of 64 (the timed grid has none) fails `asv continuous -b
Quick` with exit 2, leaves Quick untimed, and the named case's error series fails. As the
README's check, in a copy of this repository: CPU backend, tiny grid."""

import json
import subprocess
import sys

import pytest

from conftest import checkout_copy, git
from verify_attn import cases

# flash's CPU twin skips the keys of the prefix past its last multiple of 64: correct on
# every timed point (prefix 0 and 2048), wrong on ragged, paged and odd prefixes.
PLANT = ("          vis[k] = visible(p, b, prefix, i, t);\n",
         "          vis[k] = visible(p, b, prefix, i, t) && !(t < prefix && t >= prefix / 64 * 64);  // planted\n")
ODD = sorted(n for n, c in cases.CASES.items() if not c.large and any(p % 64 for p in c.prefix_lens))
EVEN = sorted(n for n, c in cases.CASES.items() if not c.large and not any(p % 64 for p in c.prefix_lens))


@pytest.fixture(scope="module")
def continuous(tmp_path_factory):
    """asv continuous -f 1.03 -b Quick over a base commit and one with the planted break."""
    repo, env = checkout_copy(tmp_path_factory.mktemp("gate"))
    cpu = repo / "kernels" / "cpu.cpp"
    assert PLANT[0] in cpu.read_text(), "flash_cpu's mask line moved: update the plant"
    cpu.write_text(cpu.read_text().replace(*PLANT))
    git(repo, "commit", "-qam", "planted: odd prefixes lose their last partial tile")
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", "ci"], cwd=repo, env=env, check=True, capture_output=True)
    proc = subprocess.run([*asv, "continuous", "--machine", "ci", "-f", "1.03", "-b", "Quick", "HEAD~1", "HEAD"],
                          cwd=repo, env=env, capture_output=True, text=True)
    return repo, env, proc


def results(repo, rev) -> dict:
    commit = subprocess.run(["git", "rev-parse", rev], cwd=repo, capture_output=True, text=True).stdout.strip()
    (path,) = (repo / "results" / "ci").glob(f"{commit[:8]}-*.json")
    return json.loads(path.read_text())


def values(data: dict, key: str) -> dict:
    """{params tuple: value} of one benchmark in a results file."""
    import ast
    import itertools

    value, params = data["results"][f"bench_verify_attn.{key}"][:2]
    combos = itertools.product(*[[ast.literal_eval(v) for v in p] for p in params])
    return dict(zip(combos, value))


def test_a_break_off_the_timed_grid_exits_2(continuous):
    repo, env, proc = continuous
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "not timed: named cases failed: flash on" in proc.stdout + proc.stderr

    base, planted = results(repo, "HEAD~1"), results(repo, "HEAD")
    # The named cases: flash fails exactly those with a prefix that is not a multiple of 64.
    cases_base, cases_planted = values(base, "QuickCases.track_error"), values(planted, "QuickCases.track_error")
    assert ODD and EVEN
    for name in ODD + EVEN:
        assert cases_base[(name, "flash")] > 0 and cases_base[(name, "naive")] > 0, name
        assert cases_planted[(name, "naive")] == cases_base[(name, "naive")], name
        assert (cases_planted[(name, "flash")] is None) == (name in ODD), (name, cases_planted[(name, "flash")])

    # Quick's timed points: timed at the base, not at the plant, whose own check at those
    # points gave the base's errors exactly (their outputs did not change).
    time_base, time_planted = values(base, "Quick.track_time"), values(planted, "Quick.track_time")
    points = [k for k, v in time_base.items() if isinstance(v, float) and v == v]
    assert {(h, q, p) for h, q, p, _ in points} == {(8, 9, 0), (8, 9, 2048)}
    assert {i for *_, i in points} == {"naive", "flash"}
    assert all(time_planted[k] is None for k in points)
    err_base, err_planted = values(base, "Quick.track_error"), values(planted, "Quick.track_error")
    assert all(err_planted[k] == err_base[k] and err_base[k] > 0 for k in points)


def test_the_report_says_failed(continuous):
    repo, env, _ = continuous
    proc = subprocess.run([sys.executable, "-m", "verify_attn", "report", "--machine", "ci", "-b", "Quick",
                           "HEAD~1", "HEAD"], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "**failed**" in proc.stdout.splitlines()[0]
    assert "| Quick h8 q9 p2048 | flash |" in proc.stdout
    assert "ragged_3x16x9" in proc.stdout  # the named cases that failed are named


def test_quick_sees_every_head_count_and_kernel_under_test():
    """On the GPU, Quick times every kernel under test but the gated-only paths at every head
    count; the CPU and tiny selections stay a couple of points (CI time); the asv class's
    parameters hold every point."""
    from benchmarks.bench_verify_attn import Quick
    from verify_attn import grid, registry

    quick = grid.SELECTIONS["cuda"]["quick"]
    assert {h for h, _, _ in quick.points()} == set(grid.HEADS) and quick.impls == "under_test"
    assert set(Quick.params[3]) == set(registry.under_test()) - set(grid.GATED_ONLY)
    for table in grid.SELECTIONS.values():
        for h, q, p in table["quick"].points():
            assert h in Quick.params[0] and q in Quick.params[1] and p in Quick.params[2]
    assert len(grid.SELECTIONS["cpu"]["quick"].points()) <= 2 and len(grid.SELECTIONS["tiny"]["quick"].points()) <= 2
