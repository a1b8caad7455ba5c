"""Where a kernel's warps wait: Nsight Compute's per-instruction warp samples, summed by kind.

ncu's SourceCounters section samples every warp's state at a fixed interval and files each
sample under the instruction the warp is at, with its stall reason. The source page of one
launch (`--page source --print-source cuda,sass --csv`) lists every source line the kernel's
machine code came from, and under each line its SASS instructions with their samples; an
instruction inlined from several frames is listed under each, so it is counted once here, by
its address.

A kind says what the warp was waiting for, read from the machine code, not from the source:

- ``mbarrier wait``: the test of an mbarrier's phase (``SYNCS.PHASECHK``) and the branch behind
  it, i.e. a try_wait loop (data landing, a stage released);
- ``wgmma wait``: ``WARPGROUP.DEPBAR`` / ``WARPGROUP.ARRIVE`` (ncu files these as barrier stalls:
  waiting for warpgroup MMAs to finish, or to start);
- ``wgmma issue``: the ``HGMMA`` instructions themselves (a warp waiting there for the other
  warps of its warpgroup included);
- ``named barrier wait``: any other instruction whose samples are mostly ``barrier`` stalls: the
  first ones behind a ``BAR.SYNC`` (``bar.sync`` / ``bar.arrive`` handoffs; with a deferred
  barrier the warp stalls a few instructions after it, so the kind is read from the stall);
- ``other``: the rest (softmax, addressing, stores), with its stall reasons beside it, since
  a longer dependent chain there shows as ``wait`` and ``short_sb`` stalls.

Samples count warps, so a kernel with more warps collects more samples a microsecond; compare
kernels of equal warps a block, or the kinds' shares.
"""

from __future__ import annotations

import collections
import csv
import io
from dataclasses import dataclass, field

KINDS = ("mbarrier wait", "named barrier wait", "wgmma wait", "wgmma issue", "other")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


class SourcePageError(ValueError):
    """The text is not an ncu source page with SASS and warp samples."""


@dataclass
class Instruction:
    address: int
    sass: str
    samples: float
    executed: float
    reasons: dict[str, float]  # stall reason (ncu's stall_* columns, "stall_" dropped) -> samples
    lines: list[tuple[str, int, str]] = field(default_factory=list)  # (file, line, source text) frames

    @property
    def opcode(self) -> str:
        words = self.sass.split()
        return (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0]) if words else ""


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse(text: str) -> tuple[str, list[Instruction]]:
    """(function name, its instructions in address order) of one launch's source page."""
    function, header, frame, file = "", None, None, ""
    by_address: dict[int, Instruction] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or row[0].startswith("=="):
            continue
        if row[0] == "File Path":
            path = row[1] if len(row) > 1 else ""
            frame = None
            file = path.rsplit("/", 1)[-1]
            continue
        if row[0] == "Function Name":
            function = row[1] if len(row) > 1 else ""
            continue
        if row[0] == "Line No":
            header = row
            continue
        if header is None or len(row) < 4:
            continue
        values = dict(zip(header[4:], row[4:]))
        if row[0].strip():  # a source line; its instructions follow
            frame = (file, int(row[0]), row[1].strip())
            continue
        if not row[2].strip() or row[2] == "..." or frame is None:
            continue
        address = int(row[2], 16)
        ins = by_address.get(address)
        if ins is None:
            reasons = {k[6:]: _number(v) for k, v in values.items()
                       if k.startswith("stall_") and "Not Issued" not in k}
            ins = by_address[address] = Instruction(address, row[3].strip(), _number(values.get(SAMPLES, "0")),
                                                    _number(values.get(EXECUTED, "0")), reasons)
        ins.lines.append(frame)
    if header is None or SAMPLES not in header:
        raise SourcePageError("no source page with warp samples (ncu --section SourceCounters, "
                              "--page source --print-source cuda,sass --csv)")
    return function, [by_address[a] for a in sorted(by_address)]


def kind(instructions: list[Instruction], n: int) -> str:
    """What instruction n's samples waited for (the module's docstring)."""
    ins = instructions[n]
    before = instructions[n - 1].sass if n else ""
    op = ins.opcode
    if op.startswith(("WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE")):
        return "wgmma wait"
    if "SYNCS.PHASECHK" in ins.sass or ("SYNCS.PHASECHK" in before and op == "BRA"):
        return "mbarrier wait"
    if op.startswith("HGMMA"):
        return "wgmma issue"
    if ins.samples > 0 and ins.reasons.get("barrier", 0.0) > 0.5 * ins.samples:
        return "named barrier wait"
    return "other"


def summarise(instructions: list[Instruction], top: int = 10) -> dict:
    """Samples, warp instructions, samples by kind, the stall reasons of "other", and the top
    source lines and instructions by samples."""
    total = sum(i.samples for i in instructions)
    kinds = collections.Counter({k: 0.0 for k in KINDS})
    other = collections.Counter()
    by_line: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    kind_of = [kind(instructions, n) for n in range(len(instructions))]
    for ins, k in zip(instructions, kind_of):
        kinds[k] += ins.samples
        if k == "other":
            other.update(ins.reasons)
        for frame in dict.fromkeys(ins.lines):  # each frame once, every frame of an inlined call
            by_line[frame]["samples"] += ins.samples
            by_line[frame].update({f"reason:{r}": v for r, v in ins.reasons.items()})
    lines = sorted(by_line.items(), key=lambda kv: -kv[1]["samples"])[:top]
    ranked = sorted(range(len(instructions)), key=lambda n: -instructions[n].samples)[:top]
    return {
        "samples": total,
        "warp_instructions": sum(i.executed for i in instructions),
        "kinds": dict(kinds),
        "other_reasons": dict(other.most_common()),
        "lines": [{"where": f"{f}:{ln}", "source": text, "samples": c["samples"],
                   "reasons": _top({k[7:]: v for k, v in c.items() if k.startswith("reason:")})}
                  for (f, ln, text), c in lines],
        "instructions": [{"offset": instructions[n].address - instructions[0].address, "sass": instructions[n].sass,
                          "where": "{}:{}".format(*instructions[n].lines[0][:2]), "kind": kind_of[n],
                          "samples": instructions[n].samples, "reasons": _top(instructions[n].reasons)}
                         for n in ranked],
    }


def _top(reasons: dict[str, float], n: int = 3) -> dict[str, float]:
    return dict(sorted(((r, v) for r, v in reasons.items() if v > 0), key=lambda kv: -kv[1])[:n])


def table(name: str, s: dict) -> str:
    """One kernel's summary for a person: shares of its samples."""
    total = s["samples"] or 1.0

    def pct(v: float) -> str:
        return f"{100 * v / total:.1f}%"

    out = [f"{name}: {s['samples']:.0f} warp samples, {s['warp_instructions'] / 1e6:.2f} M warp instructions",
           "  by kind: " + ", ".join(f"{k} {pct(v)}" for k, v in s["kinds"].items()),
           "  other, by reason: " + ", ".join(f"{r} {pct(v)}" for r, v in list(s["other_reasons"].items())[:6]),
           "  source lines (every frame of an inlined call counts):"]
    out += [f"    {pct(l['samples']):>6s} {l['where']:28s} [{', '.join(f'{r} {pct(v)}' for r, v in l['reasons'].items())}]"
            f"  {l['source'][:70]}" for l in s["lines"]]
    out.append("  instructions:")
    out += [f"    {pct(i['samples']):>6s} +{i['offset']:<6x} {i['sass'][:56]:56s} {i['kind']:18s} {i['where']}"
            for i in s["instructions"]]
    return "\n".join(out)
