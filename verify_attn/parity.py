"""Parity on the named cases (verify_attn.cases.CASES): each implementation against the
float64 reference.

The check verb prints it; the Quick benchmarks run it before timing anything, because the
timed grid has only prefixes that are multiples of 2048, one batch element and contiguous
rows: a break that shows only on an odd or ragged prefix, a paged pool or another tree
passes there and fails here.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from . import accuracy, cases
from .measure import skip_reason
from .reference import reference


@dataclasses.dataclass
class Outcome:
    impl: str
    error: accuracy.Error | None = None  # None when skipped
    skipped: str = ""                    # why the implementation did not run the inputs


def named(device: str) -> list[cases.Case]:
    """The named cases a device checks: all of them on CUDA, on the CPU those not marked large."""
    return [c for c in cases.CASES.values() if device == "cuda" or not c.large]


def check(inputs: cases.Inputs, impls, case: cases.Case | None = None) -> Iterator[Outcome]:
    """Each implementation on these inputs, poisoned outputs first (accuracy.run_check); the
    reference is computed once, and only if one of them runs."""
    ref = None
    for impl in impls:
        reason = skip_reason(impl, case, inputs)
        if reason:
            yield Outcome(impl, skipped=reason)
            continue
        if ref is None:
            ref = reference(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices)
        yield Outcome(impl, accuracy.run_check(impl, inputs, ref))
