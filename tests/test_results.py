"""results/ is the product's memory: every committed file is readable asv results, and each
machine's results share one parameter set (asv publish draws one series per set, so a
machine field that changed between runs would cut the history in two)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MACHINES = sorted(p.parent for p in (ROOT / "results").glob("*/machine.json"))


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        pytest.fail(f"{path.relative_to(ROOT)} is not JSON: {err}")


def test_there_is_a_history():
    assert MACHINES, "results/ holds no machine"
    assert (ROOT / "results" / "benchmarks.json").is_file()


@pytest.mark.parametrize("machine", MACHINES, ids=lambda p: p.name)
def test_one_series_per_machine(machine):
    info = load(machine / "machine.json")
    assert info["machine"] == machine.name
    files = sorted(p for p in machine.glob("*.json") if p.name != "machine.json")
    assert files, f"{machine.name}: no results"
    params = {}
    for path in files:
        data = load(path)
        assert len(data["commit_hash"]) == 40 and path.name.startswith(data["commit_hash"][:8]), path.name
        assert data["results"], f"{path.name}: no benchmark results"
        params.setdefault(json.dumps(data["params"], sort_keys=True), []).append(path.name)
    assert len(params) == 1, f"{machine.name}: results split over parameter sets {params}"
    only = json.loads(next(iter(params)))
    assert only["machine"] == machine.name
    assert set(only) - {"machine", "python"} <= set(info), "a parameter the machine entry does not hold"
