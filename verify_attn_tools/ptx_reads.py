"""Registers a kernel may read before writing them, from its PTX: BASE against the working tree (nvcc, no GPU).

    python -m verify_attn ptx-reads [BASE] [--arch sm_90 ...] [--sources tc_mma.cu ...] [--json FILE]

Every kernel source of kernels/ is compiled to PTX at BASE (a git revision, default main) and
in the working tree, with this checkout's build flags, for each architecture of the resource
report (sm_90 as sm_90a, sm_80, sm_120). In each kernel a forward analysis over its basic
blocks finds the virtual registers that some path from the entry reads before any write: a
value the compiler could not define, such as a loop-carried maximum that C++ leaves unset
before the first iteration. Such a register holds whatever the hardware register held, so the
float64 check catches it only where that value happens to be bad: a row maximum left unset on
a block's first tile gave NaN rows on some named cases and passed others.

What reaches the PTX is what it can find: LLVM folds many undefined values before (a C++
read of an unset local may become a constant), and keeps those that flow into inline assembly
(nan_max's max.NaN above) or around a loop. A guarded instruction writes nothing for certain;
wgmma's accumulators, which it reads as well when it accumulates, count as written.

The compiler also reads such registers where no value depends on them: it computes both sides
of a select ahead of the branch C++ wrote (flash's queries past the last row, multiplied and
then replaced by 0), or branches twice on one predicate, a path the analysis takes and no run
can (tc_attn_ws). So the verb compares: per kernel, the source lines (file and text, from
the PTX's .loc, the call site where a function was inlined) where the working tree's code
reads a register before a write and BASE's does not; not a count, which an unrolled loop or a
template's arguments move. What counts as a write: an instruction's first operand (a
register, a `{...}` vector, `a|b`), except where the instruction writes only memory or
nothing (stores, reductions, barriers, branches, fences, async copies, mbarrier set-up).
Exit 0 when no kernel reads at a new place, 1 when one does (its first such reads shown), 2
when a revision is unknown or a source does not compile.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Callable

from verify_attn import build, resources

from . import sass
from .cli import Refusal, parser, refusing


# Opcodes whose first operand is not a destination register: by their first dotted part, or
# their first two (mbarrier's, wgmma's, multimem's).
NO_DEST = {"st", "red", "bar", "barrier", "bra", "brx", "ret", "exit", "trap", "membar", "fence", "cp",
           "prefetch", "prefetchu", "stmatrix", "nanosleep", "setmaxnreg", "griddepcontrol", "tensormap",
           "pmevent", "brkpt", "call", "discard", "applypriority", "mbarrier.init", "mbarrier.expect_tx",
           "mbarrier.complete_tx", "mbarrier.inval", "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
           "multimem.st", "multimem.red", ".branchtargets"}
WRITES_FIRST = {"bar.red", "barrier.red"}  # __syncthreads_count and kin: a register and a barrier
SKIP = (".reg", ".loc", ".local", ".shared", ".param", ".pragma", ".file", ".section")
GUARD = re.compile(r"@!?%?[\w$]+\s+")
JUMP = re.compile(r"(@!?%?[\w$]+\s+)?(bra|brx|ret|exit|trap)\b\S*\s*(.*)")
LABEL = re.compile(r"([\w$]+):\s*")
LOC = re.compile(r"\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)(?:.*?inlined_at\s+(\d+)\s+(\d+))?")


def _opcode_key(opcode: str) -> tuple[str, str]:
    parts = opcode.split(".")
    return parts[0], ".".join(parts[:2])


def _operands(text: str) -> list[str]:
    """Top-level comma-separated operands ({...} and [...] kept whole)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _tokens(body: str):
    """("label", name, scope) and ("stmt", statement, scope, line, loc) of an entry's body in
    order, each statement "opcode operands" with single spaces (one may span lines; line: where
    it starts; loc: (file number, line) of the source, from the last .loc, None before one). Inline assembly puts several on one line in braces, with declarations and labels
    of its own (the same label in every inlined copy), so a label is known within its braces."""
    scopes, fresh, pending, start, loc, loc_start = [0], 0, "", "", None, None
    for raw in body.splitlines():
        m = LOC.match(raw)
        if m:  # the source line of what follows: the call's where it was inlined
            loc = (int(m.group(4)), int(m.group(5))) if m.group(4) else (int(m.group(1)), int(m.group(2)))
            continue
        pieces = raw.split("//")[0].split(";")
        for n, piece in enumerate(pieces):
            part = " ".join((pending + " " + piece).split()) if pending else " ".join(piece.split())
            where, at, pending = (start if pending else raw.strip()), (loc_start if pending else loc), ""
            while True:
                if part.startswith("{"):
                    fresh += 1
                    scopes.append(fresh)
                    part = part[1:].strip()
                elif part.startswith("}"):
                    if len(scopes) > 1:
                        scopes.pop()
                    part = part[1:].strip()
                elif LABEL.match(part):
                    m = LABEL.match(part)
                    yield "label", m.group(1), scopes[-1]
                    part = part[m.end():].strip()
                else:
                    break
            if not part or part.startswith(SKIP):
                continue
            if n == len(pieces) - 1:  # no ';' yet: the statement goes on on the next line
                pending, start, loc_start = part, where, at
                continue
            yield "stmt", part, scopes[-1], where, at


def _parse(stmt: str, reg: re.Pattern) -> tuple[list[str], list[str]]:
    """(registers read, registers written) of one instruction. A guarded instruction writes
    nothing for certain: its destination counts as read-before-written only where no path
    writes it otherwise (the guard may be false)."""
    reads = []
    guard = GUARD.match(stmt)
    if guard:
        reads += reg.findall(guard.group(0))
        stmt = stmt[guard.end():]
    opcode, _, rest = stmt.partition(" ")
    ops = _operands(rest)
    first, second = _opcode_key(opcode)
    dest: list[str] = []
    writes_first = second in WRITES_FIRST or (first not in NO_DEST and second not in NO_DEST)
    if ops and writes_first and not ops[0].startswith(("[", "_")):
        dest = reg.findall(ops[0])
        ops = ops[1:]
    reads += [r for op in ops for r in reg.findall(op)]
    return reads, ([] if guard else dest)


def _blocks(body: str) -> tuple[list[list[tuple]], list[list[int]]]:
    """The entry's basic blocks (each a list of (statement, the line it starts on, loc)) and each
    block's successors: a block starts at a label or after a branch, return or exit; brx.idx
    goes to the labels of its .branchtargets list."""
    blocks, labels, jumps, lists, cur = [], {}, {}, {}, []
    last_label = None
    for token in _tokens(body):
        if token[0] == "label":
            if cur:
                blocks.append(cur)
                cur = []
            labels[token[2], token[1]] = len(blocks)
            last_label = (token[2], token[1])
            continue
        _, stmt, scope, raw, loc = token
        if stmt.startswith(".branchtargets") and last_label:
            lists[last_label] = re.findall(r"[\w$]+", stmt[len(".branchtargets"):])
            continue
        cur.append((stmt, raw, loc))
        if JUMP.match(stmt):
            jumps[len(blocks)] = scope
            blocks.append(cur)
            cur = []
    blocks.append(cur)

    def target(name: str, scope: int) -> int | None:
        return labels.get((scope, name), labels.get((0, name)))

    succ = []
    for n, block in enumerate(blocks):
        m = JUMP.match(block[-1][0]) if n in jumps else None
        out = []
        if m and m.group(2) == "bra":
            out.append(target(m.group(3).strip(), jumps[n]))
        elif m and m.group(2) == "brx":
            table = _operands(m.group(3))[-1] if m.group(3) else ""
            names = lists.get((jumps[n], table), lists.get((0, table), []))
            out += [target(t, jumps[n]) for t in names]
        if not m or m.group(1):  # a guarded branch or return falls through too
            out.append(n + 1)
        succ.append([t for t in out if t is not None and t < len(blocks)])
    return blocks, succ


def _entries(ptx: str) -> list[tuple[str, str]]:
    """(name, body) of each entry: up to the next function (inline assembly may put a brace at
    the start of a line, so the body's closing brace cannot be told by its place)."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"\.entry\s+([\w$]+)", ptx)]
    ends = [m.start() for m in re.finditer(r"\n(?:\.visible\s+|\.weak\s+|\.extern\s+)?\.(?:entry|func)\b", ptx)]
    out = []
    for at, name in starts:
        end = min([e for e in ends if e > at] or [len(ptx)])
        text = ptx[at:end]
        out.append((name, text[text.index("{", text.index(")")) + 1:]))
    return out


def undefined_reads(ptx: str) -> dict[str, list[tuple]]:
    """{entry: [(register, the PTX line of a read, its source (file number, line)), ...]} for
    every entry of the PTX with a virtual register that some path from the entry reads before
    any write (entries without any left out). A forward must-be-written analysis over the
    entry's basic blocks: a register counts as written at a block when it is written on every
    path there."""
    out = {}
    for name, body in _entries(ptx):
        found = _reads_of(body)
        if found:
            out[name] = found
    return out


def _reads_of(body: str) -> list[tuple]:
    """undefined_reads of one entry's body."""
    prefixes = set(re.findall(r"\.reg\s+\.\w+\s+%([a-z]+)<\d+>", body))
    if not prefixes:
        return []
    reg = re.compile(r"%(?:" + "|".join(sorted(prefixes, key=len, reverse=True)) + r")\d+\b")
    blocks, succ = _blocks(body)
    parsed = [[(_parse(stmt, reg), raw, loc) for stmt, raw, loc in block] for block in blocks]
    writes = [set(w for (_, ws), _, _ in block for w in ws) for block in parsed]
    every = set().union(*writes)
    preds = [[] for _ in blocks]
    for n, ss in enumerate(succ):
        for t in ss:
            preds[t].append(n)
    reached, todo = {0}, [0]
    while todo:
        for t in succ[todo.pop()]:
            if t not in reached:
                reached.add(t)
                todo.append(t)
    entry_in = [set() if n == 0 else None for n in range(len(blocks))]
    out_sets = [every for _ in blocks]  # the meet's start: written everywhere, until a path says not
    changed = True
    while changed:
        changed = False
        for n in range(len(blocks)):
            into = set() if n == 0 else (set.intersection(*(out_sets[p] for p in preds[n])) if preds[n] else every)
            new = into | writes[n]
            if new != out_sets[n] or entry_in[n] != into:
                out_sets[n], entry_in[n], changed = new, into, True
    found = {}
    for n, block in enumerate(parsed):
        if n not in reached:
            continue
        have = set(entry_in[n])
        for (reads, ws), raw, loc in block:
            for r in reads:
                if r not in have and r not in found:
                    found[r] = (raw, loc)
            have.update(ws)
    return [(r, raw, loc) for r, (raw, loc) in sorted(found.items())]


def ptx_of(source: Path, arch: str, flags: tuple[str, ...]) -> str:
    """The PTX of one kernel source for one architecture of the resource report."""
    return sass.nvcc(source, resources.BUILT_AS.get(arch, arch), flags, "-ptx", "-o", "-")


@dataclasses.dataclass(frozen=True)
class Read:
    register: str
    ptx: str          # the PTX line that reads it
    where: str        # the source line it comes from, file:line (where it was inlined)
    source: str       # that line's text

    def same_line(self) -> tuple[str, str]:
        """What stays put when an edit above moves a line: its file and text."""
        return self.where.rsplit(":", 1)[0], self.source


def _source_lines(ptx: str) -> Callable[[tuple | None], tuple[str, str]]:
    """(file:line, text) of a .loc's (file number, line), from the PTX's .file table."""
    files = {int(n): Path(p) for n, p in re.findall(r'\.file\s+(\d+)\s+"([^"]+)"', ptx)}
    texts: dict[Path, list[str]] = {}

    def of(loc: tuple | None) -> tuple[str, str]:
        if loc is None or loc[0] not in files:
            return "?", ""
        path = files[loc[0]]
        if path not in texts:
            texts[path] = path.read_text(errors="replace").splitlines() if path.is_file() else []
        lines = texts[path]
        return f"{path.name}:{loc[1]}", (lines[loc[1] - 1].strip() if 0 < loc[1] <= len(lines) else "")

    return of


def scan(src: Path, names: list[str], archs) -> dict[tuple[str, str, str], list[Read]]:
    """{(arch, source, kernel): [Read, ...]} of every kernel of the named sources of src (an
    empty list for a kernel that reads nothing unwritten)."""
    flags = build.spec(cuda=True).cuda_flags
    jobs = [(arch, name) for arch in archs for name in names if (src / name).exists()]

    def one(job):
        ptx = ptx_of(src / job[1], job[0], flags)
        entries, line = _entries(ptx), _source_lines(ptx)
        short = [resources._short(k) for k, _ in entries]
        # the short name where it is one kernel's (a template's type arguments are dropped)
        return {(job[0], job[1], s if short.count(s) == 1 else k):
                [Read(r, raw, *line(loc)) for r, raw, loc in _reads_of(body)] for (k, body), s in zip(entries, short)}

    out = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(jobs)) or 1) as pool:
        for part in pool.map(one, jobs):
            out.update(part)
    return out


def both(sha: str, sources: list[str] | None, archs: tuple[str, ...]) -> tuple[dict, dict]:
    """scan's result for rev's kernels/ and for the working tree's."""
    with tempfile.TemporaryDirectory() as tmp:
        base_src, head_src, names = sass.both_sources(sha, sources, Path(tmp))
        return scan(base_src, names, archs), scan(head_src, names, archs)


def more(base: dict, head: dict) -> dict[tuple[str, str, str], list[Read]]:
    """The head's kernels with reads at source lines (file and text: an edit above a line moves
    its number) where the base's same kernel reads nothing unwritten, and those reads: not a
    count, which an unrolled loop's trip count or a template's arguments move."""
    out = {}
    for key, reads in head.items():
        seen = {r.same_line() for r in base.get(key, [])}
        new = [r for r in reads if r.same_line() not in seen]
        if new:
            out[key] = new
    return out


def main(argv=None) -> int:
    return refusing("ptx-reads", run, argv)


def run(argv) -> int:
    p = parser("ptx-reads", __doc__)
    p.add_argument("base", nargs="?", default="main", help="the git revision to compare with (default main)")
    p.add_argument("--arch", nargs="+", choices=resources.ARCHS, default=list(resources.ARCHS),
                   help="architectures (default the resource report's: sm_90 as sm_90a, sm_80, sm_120)")
    p.add_argument("--sources", nargs="+", metavar="FILE.cu", help="these kernel sources only (default every .cu)")
    p.add_argument("--json", type=Path, help="also write every kernel's reads here")
    args = p.parse_args(argv)
    sha = sass.commit_of(args.base)
    base, head = both(sha, args.sources, tuple(args.arch))
    new = more(base, head)
    for (arch, source, kernel), reads in sorted(head.items()):
        if reads or base.get((arch, source, kernel)):
            fresh = new.get((arch, source, kernel), [])
            print(f"{arch} {source} {kernel}: {len(base.get((arch, source, kernel), []))} -> {len(reads)} "
                  f"registers read before a write on some path" + (f", {len(fresh)} at new places" if fresh else ""))
            for r in fresh[:3]:
                print(f"    {r.register} at {r.where} `{r.source}`: {r.ptx}")
    print(f"{len(head)} kernels ({', '.join(args.arch)}) against {sha[:8]}: "
          + (f"{len(new)} read registers before writing them at new places" if new
             else "none reads a register before writing it at a new place"))
    if args.json:
        args.json.write_text(json.dumps({"base": sha, "kernels": [
            {"arch": a, "source": s, "kernel": k, "base": [dataclasses.asdict(x) for x in base.get((a, s, k), [])],
             "head": [dataclasses.asdict(x) for x in r], "new": [dataclasses.asdict(x) for x in new.get((a, s, k), [])]}
            for (a, s, k), r in sorted(head.items())]}, indent=1))
    return 1 if new else 0
