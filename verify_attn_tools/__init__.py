"""The tooling around the measured package: the command line, history, plots, publishing,
detection power, cross-checks. It runs from a checkout, is never installed into asv's
per-commit environments, and a change to it needs no new GPU results."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout this tooling belongs to

# Results of a machine this repository tracks live in results/<machine>/ (committed) and are
# published to html/; a machine is tracked once its folder is there (`run --track` starts
# one). Any other box (a newcomer's CPU, a laptop) records into LOCAL and gets a local site,
# so that its runs never touch committed files.
LOCAL_DIR = ".asv/local"  # relative to the checkout (asv reads it so from the configuration)
LOCAL = ROOT / LOCAL_DIR


def tracked(machine: str) -> bool:
    return (ROOT / "results" / machine / "machine.json").exists()
