"""The measure verb: argparse's one line for a value the op rejects, an error when nothing
could be timed, and CPU defaults that finish in seconds with a line per case on stderr."""

import pytest

from verify_attn import grid
from verify_attn_tools import cli, measure


@pytest.mark.parametrize("args, option", [
    (["--q-len", "0"], "--q-len"), (["--q-len", "1025"], "--q-len"), (["--prefix-len", "-5"], "--prefix-len"),
    (["--samples", "0"], "--samples"), (["--batch", "0"], "--batch"), (["--heads", "0"], "--heads"),
    (["--pad-to", "0"], "--pad-to"), (["--batch", "2048", "--heads", "64"], "--batch x --heads"),
    (["--prefix-len", str(2**24 - 1), "--q-len", "9"], "--prefix-len + --q-len"),
])
def test_values_the_op_rejects_are_argparse_errors(args, option, capsys):
    with pytest.raises(SystemExit) as exc:
        measure.main(["--device", "cpu", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m verify_attn measure: error:") and option in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_nothing_timed_exits_1_and_says_why(capsys):
    assert cli.main(["measure", "--device", "cpu", "--impl", "tc", "--prefix-len", "0", "--samples", "1"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("# case")]
    assert len(err) == 1 and "nothing timed" in err[0] and "tc has no cpu implementation" in err[0]


def test_cpu_defaults_are_the_cpu_quick_points_with_progress(capsys):
    cpu = grid.SELECTIONS["cpu"]["quick"]
    args = measure.arguments(["--device", "cpu"])
    assert (args.heads, args.q_len, args.prefix_len) == (list(cpu.heads), list(cpu.q_lens), list(cpu.prefix_lens))
    gpu = measure.arguments(["--device", "cuda"])
    assert gpu.heads == list(grid.MEASURE_DEFAULT["heads"])
    assert gpu.prefix_len == list(grid.MEASURE_DEFAULT["prefix_lens"])

    assert measure.main(["--device", "cpu", "--impl", "torch", "--samples", "2"]) == 0
    out, err = capsys.readouterr()
    names = [f"h{h}_q{q}_p{p}" for h, q, p in cpu.points()]
    assert [line for line in err.splitlines() if line.startswith("# case")] == [
        f"# case {k} of {len(names)}: {n}" for k, n in enumerate(names, 1)]
    assert all(any(line.startswith(n) and "torch" in line for line in out.splitlines()) for n in names)
