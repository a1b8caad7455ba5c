"""Two source pages of a kernel side by side: where a change moved its warps' samples.

    python -m verify_attn stalls BASE.csv HEAD.csv [--top 12] [--json FILE]

Each file is one launch's Nsight Compute source page with warp samples: what `python -m
verify_attn.profile --source` keeps of each point (the `page:` under its table, e.g.
source-chain-h64-q9-p65536-tc.csv; the next run replaces them: copy the base's pages before
profiling the head), or `ncu --import R.ncu-rep --page source --print-source cuda,sass --csv` of
a report taken with `--section SourceCounters`. Both are read as verify_attn.stalls reads one page (an instruction inlined from
several frames counted once); the verb prints the samples and warp instructions of each, the
samples by kind (mbarrier wait, named barrier wait, wgmma wait, wgmma issue, other) and by stall
reason within "other", and the source lines whose samples moved most: a line is paired with its
own text in the other page where an edit above it moved its number (shown as file:base->head),
and else by its number, marked where the base's text differs.

A shortened chain that only moves its time to a wait shows here as samples leaving one line and
reaching a wait's: the question `ab` (is it faster?) leaves open, and `ab --source` asks it at
the points it names, the base's build profiled beside the head's. Samples count warps, so pages of
kernels with different warps a block compare by shares, not counts (the verb says when the two
functions differ). Exit 0; 2 for a file that is missing or not such a page.
"""

from __future__ import annotations

import collections
import difflib
import json
from pathlib import Path

from verify_attn import stalls
from verify_attn.profile import kernel_name

from .cli import Refusal, bounded, parser, refusing

ALL = 1 << 30  # every line: summarise's top


def read(path: Path) -> tuple[str, dict]:
    """(function name, stalls.summarise of every line) of one page; Refusal when unreadable."""
    if not path.is_file():
        raise Refusal(f"{path}: no such file")
    try:
        function, instructions = stalls.parse(path.read_text(errors="replace"))
    except stalls.SourcePageError as exc:
        raise Refusal(f"{path}: {exc}") from None
    if not instructions:
        raise Refusal(f"{path}: a source page without instructions")
    return function, stalls.summarise(instructions, ALL)


def compare(base: dict, head: dict, top: int) -> dict:
    """Totals, kinds, the reasons of "other" and the lines of base and head, with the change;
    lines are ranked by the size of their change, largest first."""
    def pair(a: float, b: float) -> dict:
        return {"base": a, "head": b, "change": b - a}

    moved = []
    for a, b in match(base["lines"], head["lines"]):
        wa, wb = (a or b)["where"], (b or a)["where"]
        where = wa if wa == wb else f"{wa}->{wb.rsplit(':', 1)[1]}"
        moved.append({"where": where, **pair((a or {}).get("samples", 0.0), (b or {}).get("samples", 0.0)),
                      "base_source": a and a["source"], "head_source": b and b["source"]})
    moved.sort(key=lambda m: (-abs(m["change"]), m["where"]))
    reasons = sorted(set(base["other_reasons"]) | set(head["other_reasons"]))
    return {
        "samples": pair(base["samples"], head["samples"]),
        "warp_instructions": pair(base["warp_instructions"], head["warp_instructions"]),
        "kinds": {k: pair(base["kinds"].get(k, 0.0), head["kinds"].get(k, 0.0)) for k in stalls.KINDS},
        "other_reasons": {r: pair(base["other_reasons"].get(r, 0.0), head["other_reasons"].get(r, 0.0))
                          for r in reasons if base["other_reasons"].get(r) or head["other_reasons"].get(r)},
        "lines": moved[:top],
    }


def match(base: list[dict], head: list[dict]) -> list[tuple[dict | None, dict | None]]:
    """The base's and the head's source lines in pairs: the same line (file, number and text);
    then the same text of one file, where that text is one line left on each side (an edit
    above it moved its number); then a text that repeats, in the order of its lines (difflib
    over each file's lines left); then the same number (its text edited). The rest stand
    alone, as (line, None) or (None, line)."""
    pairs, left_b, left_h = [], list(base), list(head)

    def take(key) -> None:
        nonlocal left_b, left_h
        count_b = collections.Counter(key(l) for l in left_b)
        by_key = {}
        for l in left_h:
            by_key.setdefault(key(l), []).append(l)
        taken = set()
        for l in left_b:
            k = key(l)
            if count_b[k] == 1 and len(by_key.get(k, ())) == 1:
                pairs.append((l, by_key[k][0]))
                taken.add(id(l))
                taken.add(id(by_key[k][0]))
        left_b = [l for l in left_b if id(l) not in taken]
        left_h = [l for l in left_h if id(l) not in taken]

    def file_of(l: dict) -> str:
        return l["where"].rsplit(":", 1)[0]

    def in_order() -> None:
        nonlocal left_b, left_h
        taken = set()
        for f in {file_of(l) for l in left_b}:
            lb = sorted((l for l in left_b if file_of(l) == f), key=number)
            lh = sorted((l for l in left_h if file_of(l) == f), key=number)
            blocks = difflib.SequenceMatcher(None, [l["source"] for l in lb], [l["source"] for l in lh],
                                             autojunk=False).get_matching_blocks()
            for m in blocks:
                for k in range(m.size):
                    pairs.append((lb[m.a + k], lh[m.b + k]))
                    taken.update((id(lb[m.a + k]), id(lh[m.b + k])))
        left_b = [l for l in left_b if id(l) not in taken]
        left_h = [l for l in left_h if id(l) not in taken]

    def number(l: dict) -> int:
        tail = l["where"].rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    take(lambda l: (l["where"], l["source"]))
    take(lambda l: (file_of(l), l["source"]))
    in_order()
    take(lambda l: l["where"])
    return pairs + [(l, None) for l in left_b] + [(None, l) for l in left_h]


def percent(p: dict) -> str:
    return f"{100 * p['change'] / p['base']:+.1f}%" if p["base"] else "new"


def text(names: tuple[str, str], files: tuple[str, str], c: dict) -> str:
    s, w = c["samples"], c["warp_instructions"]
    out = [f"{names[0]} ({files[0]}) -> {names[1]} ({files[1]})"]
    if names[0] != names[1]:
        out.append("  different kernels: compare the shares, not the counts (samples count warps)")
    out += [f"  warp samples {s['base']:,.0f} -> {s['head']:,.0f} ({percent(s)}); warp instructions "
            f"{w['base'] / 1e6:.2f} M -> {w['head'] / 1e6:.2f} M ({percent(w)})",
            f"  {'by kind':22s} {'base':>10s} {'head':>10s} {'change':>10s}  share base -> head"]
    for k, p in c["kinds"].items():
        out.append(f"  {k:22s} {p['base']:10,.0f} {p['head']:10,.0f} {p['change']:+10,.0f}  "
                   f"{100 * p['base'] / (s['base'] or 1):.1f}% -> {100 * p['head'] / (s['head'] or 1):.1f}%")
    ranked = sorted(c["other_reasons"].items(), key=lambda kv: -abs(kv[1]["change"]))[:6]
    out.append("  other, by reason: " + ", ".join(f"{r} {p['change']:+,.0f}" for r, p in ranked))
    out.append(f"  source lines, largest change first ({len(c['lines'])}):")
    for m in c["lines"]:
        source = m["head_source"] if m["head_source"] is not None else m["base_source"]
        gone = " (base only)" if m["head_source"] is None else " (head only)" if m["base_source"] is None else ""
        changed = " (text differs)" if None not in (m["base_source"], m["head_source"]) and m["base_source"] != m["head_source"] else ""
        out.append(f"    {m['where']:28s} {m['base']:9,.0f} -> {m['head']:9,.0f} {m['change']:+9,.0f}"
                   f"{gone}{changed}  {(source or '')[:60]}")
    return "\n".join(out)


def main(argv=None) -> int:
    return refusing("stalls", run, argv)  # 2, as a bad argument: no GPU needed, so no "cannot run here" (1)


def run(argv) -> int:
    p = parser("stalls", __doc__)
    p.add_argument("base", type=Path, help="the base's source page (CSV)")
    p.add_argument("head", type=Path, help="the head's source page (CSV)")
    p.add_argument("--top", type=bounded(1), default=12, help="source lines shown (default 12)")
    p.add_argument("--json", type=Path, help="also write the comparison here")
    args = p.parse_args(argv)
    (fb, base), (fh, head) = read(args.base), read(args.head)
    c = compare(base, head, args.top)
    print(text((kernel_name(fb), kernel_name(fh)), (args.base.name, args.head.name), c))
    if args.json:
        args.json.write_text(json.dumps({"base": {"file": str(args.base), "function": fb},
                                         "head": {"file": str(args.head), "function": fh}, **c}, indent=1))
    return 0
