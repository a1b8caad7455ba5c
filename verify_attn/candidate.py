"""What gets checked and timed: a candidate, and the one way to check it and to prepare it.

A candidate is an implementation of the registry as some build provides it: the checkout's
own op (or a Python runner), or the same op of another build loaded into this process under
its own namespace (the base commit's kernels in ``ab``, the anchor's in the suite). A kernel's
pinned-path variants (tc_mma) are registry entries, so they are candidates like any other.

``check`` runs a candidate on poisoned outputs and measures it against the float64 reference
(``reference_of``, computed once per inputs by the caller); ``outcomes`` does that for several
candidates on one set of inputs, computing the reference only if one of them runs
(``ReferenceOf``: once per inputs, however many calls check candidates on them).
``prepare`` gives the no-argument call the timer runs. The gate, the check verb, the suite,
``measure`` and ``ab`` all go through these.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import torch

from . import accuracy, ops, registry
from .reference import reference
from .shapes import is_chain

NS = "verify_attn"  # the checkout's op namespace


@dataclasses.dataclass(frozen=True)
class Candidate:
    impl: str       # the registry entry: tolerance, the cases it takes, its backends
    ns: str = NS    # torch.ops namespace of its op: another build's (va_base, va_anchor)

    @property
    def name(self) -> str:
        return self.impl if self.ns == NS else f"{self.impl}@{self.ns}"

    def op(self) -> Callable:
        entry = registry.get(self.impl)
        if entry.runner:
            return entry.function()
        return getattr(getattr(torch.ops, self.ns), self.impl)

    def skip_reason(self, inputs) -> str | None:
        """Why this candidate does not run these inputs here, or None."""
        entry = registry.get(self.impl)
        chain = all(is_chain(p) for p in inputs.parent.tolist())
        paged = inputs.kv_indices is not None
        reason = (ops.unsupported(self.impl, inputs.q.device.type)
                  or entry.rejects(chain, paged, 0 if paged else inputs.kv.shape[1], inputs.q.shape[1]))
        if reason is None and self.ns != NS and (entry.runner or not hasattr(getattr(torch.ops, self.ns), self.impl)):
            reason = f"the build in namespace {self.ns} has no op {self.impl}"
        return reason


def of(impls, ns: str = NS) -> list[Candidate]:
    return [Candidate(i, ns) for i in impls]


def reference_of(inputs) -> tuple:
    return reference(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices)


def op_args(inputs, out, lse) -> tuple:
    return (inputs.q, inputs.kv, inputs.kv_indices, inputs.parent, inputs.prefix_lens, inputs.scale, out, lse)


def check(c: Candidate, inputs, ref=None) -> accuracy.Error:
    """Run the candidate on poisoned outputs after the entry point's input checks and measure
    it against the float64 reference (computed here unless given). Bad input or a failed
    launch is a failure too."""
    if ref is None:
        ref = reference_of(inputs)
    out, lse = accuracy.poisoned_outputs(inputs.q)
    try:
        ops.validate(inputs.q, inputs.kv, inputs.parent, inputs.prefix_lens, inputs.scale, inputs.kv_indices, out, lse)
        c.op()(*op_args(inputs, out, lse))
    except (RuntimeError, ValueError) as exc:
        return accuracy.Error(float("nan"), float("nan"), float("nan"), False, str(exc).splitlines()[0])
    return accuracy.measure(c.impl, out, lse, *ref)


@dataclasses.dataclass
class Outcome:
    candidate: Candidate
    error: accuracy.Error | None = None  # None when skipped
    skipped: str = ""                    # why the candidate did not run the inputs

    @property
    def impl(self) -> str:
        return self.candidate.name


class ReferenceOf:
    """The float64 reference of one set of inputs, computed on first use and then kept."""

    def __init__(self, inputs):
        self.inputs = inputs
        self._value = None

    def get(self) -> tuple:
        if self._value is None:
            self._value = reference_of(self.inputs)
        return self._value


def outcomes(inputs, candidates, ref: ReferenceOf | None = None) -> Iterator[Outcome]:
    """Each candidate checked on these inputs; the reference is computed once (or taken from
    ref, shared with an earlier call on the same inputs), and only if one runs."""
    ref = ref or ReferenceOf(inputs)
    for c in candidates:
        reason = c.skip_reason(inputs)
        if reason:
            yield Outcome(c, skipped=reason)
            continue
        yield Outcome(c, check(c, inputs, ref.get()))


def prepare(c: Candidate, inputs) -> Callable[[], None]:
    """A no-argument call of the candidate on these inputs with no host sync (outputs
    preallocated; a Python runner gets the prefix lengths on the host, as an engine has them)."""
    args = op_args(inputs, *accuracy.poisoned_outputs(inputs.q))
    fn = c.op()
    if registry.get(c.impl).runner:
        args = args[:4] + (inputs.prefix_lens.tolist(),) + args[5:]
    return lambda: fn(*args)


def plan(c: Candidate, inputs) -> dict | None:
    """The launch plan the candidate's CUDA op takes for these inputs, or None (CPU, Python)."""
    return ops.launch_plan(c.impl, op_args(inputs, *accuracy.poisoned_outputs(inputs.q)), c.ns)
