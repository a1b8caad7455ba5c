"""The tooling around the measured package: the command line, history, plots, publishing,
detection power, cross-checks. It runs from a checkout, is never installed into asv's
per-commit environments, and a change to it needs no new GPU results."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout this tooling belongs to
