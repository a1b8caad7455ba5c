"""The README's H200 tables are the recorded results of the commits it names (verify tables)."""

import re
from pathlib import Path

from verify_attn_tools import tables

ROOT = Path(__file__).resolve().parent.parent


def named_commits(readme: str) -> tuple[str, str | None]:
    """The commit whose results the README's tables show ("... `results/nvidia-h200` of commit
    X"), and the one whose tc / FlashMLA stands beside the serving steps ("| at Y |")."""
    commit = re.search(r"`results/nvidia-h200` of commit (\w+)", readme)
    assert commit, "the README names the commit its H200 tables come from"
    before = re.search(r"\| at (\w+) \|", readme)
    return commit.group(1), before.group(1) if before else None


def test_the_readme_tables_are_the_recorded_results():
    readme = (ROOT / "README.md").read_text()
    commit, before = named_commits(readme)
    for table in tables.tables(commit, before):
        missing = [line for line in table.splitlines() if line not in readme]
        assert not missing, f"README rows that are not {commit}'s recorded results:\n" + "\n".join(missing)
        assert table in readme, f"the README's table {table.splitlines()[0]!r} is out of order against the results"


def test_rows_in_numeric_order_and_a_missing_count_leaves_the_time_alone():
    def series(metric, vals):
        return (f"bench_verify_attn.Chain.{metric}", ("1", {k: (v, None, None) for k, v in vals.items()}))

    t = {(64, 9, 2048, "tc"): 2e-5, (64, 9, 2048, "flashmla"): 4e-5, (64, 9, 2048, "torch"): 1e-4,
         (64, 9, 2048, "flash"): 2e-4, (8, 9, 16384, "tc"): 3e-5, (8, 9, 16384, "flashmla"): 3e-5,
         (8, 9, 16384, "torch"): 6e-5, (8, 9, 16384, "flash"): 3e-4}
    data = dict([series("track_time", t), series("track_flops", {(64, 9, 2048, "tc"): 2e9}),
                 series("track_time_vs_roofline", {(64, 9, 2048, "tc"): 4.0})])
    rows = tables.chain(data).splitlines()
    assert rows[2] == "| heads 8, q_len 9, prefix 16,384 | 0.03 | 0.3 | 0.06 | 0.03 | 1.00 | 2.0 |"
    assert rows[3] == "| heads 64, q_len 9, prefix 2,048 | 0.02 (100, 25%) | 0.2 | 0.1 | 0.04 | 0.50 | 5.0 |"


def spread_tables():
    """(files, the Quick table's rows) of each spread command the README shows above a Quick table."""
    readme = (ROOT / "README.md").read_text()
    for command in re.finditer(r"python -m verify_attn spread ([^\n]+)\n\n\| Quick point", readme):
        patterns = command.group(1).split()
        files = sorted(f for pattern in patterns for f in ROOT.glob(pattern))
        yield files, readme[command.end() - len("| Quick point"):].split("\n\n")[0].splitlines()[2:]


def test_the_readme_spread_tables_are_spread_over_the_runs_they_name():
    """Each spread run's Quick table in the README (tc / tc_mma / flash / naive, raw and x anchor)
    is `spread` over the result files of the command shown above it."""
    tables = list(spread_tables())
    assert len(tables) >= 3, "the README shows the latest H200 run and the runs against the anchors since"
    for files, table in tables:
        check_spread_table(files, table)


def check_spread_table(files, table):
    from verify_attn_tools import spread

    assert len(files) >= 2, files
    rows = spread.spread([spread.medians(f)[1] for f in files], 0)
    got = {(r["class"], r["combo"]): r for r in rows}
    assert len(table) == 6
    for line in table:
        shape, raw, anchor = [c.strip() for c in line.strip("|").split("|")]
        h, q, p = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+", shape))
        for series, cell in (("track_time", raw), ("track_time_vs_anchor", anchor)):
            shown = [float(x) for x in re.findall(r"\d+\.\d+", cell)]
            measured = [100 * got[("Quick", (h, q, p, impl))][series] for impl in ("tc", "tc_mma", "flash", "naive")]
            assert all(abs(a - b) <= 0.0051 for a, b in zip(shown, measured, strict=True)), (line, series, measured)
