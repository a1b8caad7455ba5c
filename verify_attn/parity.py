"""The named-case gate (verify_attn.cases.CASES): each candidate against the float64 reference.

The check verb prints it; the Quick benchmarks and ``ab`` run it before timing anything,
because the timed grid has only prefixes that are multiples of 2048, one batch element and
contiguous rows: a break that shows only on an odd or ragged prefix, a paged pool, another
tree or one kernel path passes there and fails here.
"""

from __future__ import annotations

from typing import Iterator

from . import cases
from .candidate import Candidate, Outcome, outcomes


def named(device: str) -> list[cases.Case]:
    """The named cases a device checks: all of them on CUDA, on the CPU those not marked large."""
    return [c for c in cases.CASES.values() if device == "cuda" or not c.large]


def gate(device: str, candidates: list[Candidate], seed: int = 0) -> Iterator[tuple[cases.Case, Outcome]]:
    """Every named case of the device, each candidate on it."""
    for case in named(device):
        for o in outcomes(cases.make_inputs(case, device, seed), candidates):
            yield case, o


def failures(checked) -> list[str]:
    """'impl on case (reason)' for every failed outcome of (case, outcome) pairs."""
    return [f"{o.impl} on {case.name} ({o.error.reason})" for case, o in checked
            if o.error is not None and not o.error.ok]
