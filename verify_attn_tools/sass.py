"""Which kernels' machine code a change moved, instruction by instruction (nvcc, no GPU).

    python -m verify_attn sass [BASE] [--arch sm_90a] [--sources tc_mma.cu ...] [--json FILE]

Every kernel source of kernels/ (its .cu files) is compiled to a cubin at BASE (a git revision,
default main) and in the working tree, with this checkout's build flags, for one architecture
(default sm_90a, what the H200 runs). A kernel's machine code is its .text section in the cubin
(ELF, read here: 16-byte instructions from sm_70 on; relocations live apart, so identical code
is identical bytes), named as the resource report names it (tc_attn<2,4,2,2,2,1>). Per kernel:
identical, "-R +A" (the base's instructions gone or changed, the head's new or changed, aligned
as a diff aligns lines), new or gone.

Why: a change meant to leave the other kernels alone is checked to the instruction, without a
GPU; and where `ab` flags a kernel whose code is identical in both builds, it is reading the
levels of two loaded copies of one kernel, not a change (docs/timing.md, "Two copies of one
kernel"). Exit 0 with the table; 2 when a revision's kernels do not compile or git cannot give them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import io
import json
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from verify_attn import build, resources, revision

from . import ROOT
from .cli import Refusal, parser

INSTRUCTION = 16  # bytes, sm_70 and later


def text_sections(cubin: bytes) -> dict[str, bytes]:
    """{mangled kernel name: its machine code} of a cubin: the .text.<name> sections of the
    kernels (those with a .nv.constant0.<name> parameter bank; device functions have none)."""
    if cubin[:5] != b"\x7fELF\x02" or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start:cubin.index(b"\0", start)].decode()

    sections = {name(h[0]): cubin[h[4]:h[4] + h[5]] for h in heads}
    return {n[len(".text."):]: code for n, code in sections.items()
            if n.startswith(".text.") and f".nv.constant0.{n[len('.text.'):]}" in sections}


def differing(a: bytes, b: bytes) -> tuple[int, int]:
    """(base instructions gone or changed, head instructions new or changed), aligned as a diff
    aligns lines, so that one inserted instruction counts once and not as a shift of the rest.
    An instruction's word holds its branch offsets and scheduling bits, so moved code shows."""
    words = [[c[i:i + INSTRUCTION] for i in range(0, len(c), INSTRUCTION)] for c in (a, b)]
    kept = sum(m.size for m in difflib.SequenceMatcher(None, *words, autojunk=False).get_matching_blocks())
    return len(words[0]) - kept, len(words[1]) - kept


def nvcc(source: Path, arch: str, flags: tuple[str, ...], *output: str) -> str:
    """nvcc on one kernel source with the build's flags for arch (nvcc's -arch), output the
    arguments that say what to write (-cubin -o FILE, -ptx -o -); its stdout. Refusal when nvcc
    is missing or the source does not compile, naming the first error."""
    try:
        proc = subprocess.run([resources.nvcc(), "-std=c++17", *flags, f"-arch={arch}", "-I", str(source.parent),
                               *output, str(source)], capture_output=True, text=True)
    except (RuntimeError, OSError) as exc:  # no nvcc
        raise Refusal(str(exc)) from None
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        first = next((line for line in lines if "error" in line), lines[0] if lines else "nvcc failed")
        raise Refusal(f"{source} does not compile for {arch}: {first}")
    return proc.stdout


def compile_dir(src: Path, names: list[str], arch: str, flags: tuple[str, ...], out: Path) -> dict[str, dict[str, bytes]]:
    """{source: {kernel: code}} of the named .cu files of src, compiled side by side."""
    out.mkdir(parents=True, exist_ok=True)

    def one(name: str) -> tuple[str, dict[str, bytes]]:
        cubin = out / f"{name}.cubin"
        nvcc(src / name, arch, flags, "-cubin", "-o", str(cubin))
        return name, {resources._short(k): code for k, code in text_sections(cubin.read_bytes()).items()}

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return dict(pool.map(one, names))


def kernels_at(rev: str, into: Path) -> Path:
    """kernels/ of git revision rev, unpacked under into."""
    try:
        data = revision.git(ROOT, "archive", "--format=tar", rev, "kernels", text=False)
    except revision.RevisionError as exc:
        raise Refusal(str(exc)) from None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "kernels"


def commit_of(rev: str) -> str:
    """rev's full hash; Refusal when git knows no such commit here."""
    try:
        return revision.git(ROOT, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except revision.RevisionError:
        raise Refusal(f"{rev!r} is not a commit of this repository") from None


def both_sources(rev: str, names: list[str] | None, into: Path) -> tuple[Path, Path, list[str]]:
    """(kernels/ of rev unpacked under into, the working tree's kernels/, the named kernel
    sources or every .cu of either); Refusal for a name that neither side has."""
    base_src, head_src = kernels_at(rev, into / "base"), ROOT / "kernels"
    names = names or sorted({f.name for d in (base_src, head_src) for f in d.glob("*.cu")})
    unknown = [n for n in names if not (base_src / n).exists() and not (head_src / n).exists()]
    if unknown:
        raise Refusal(f"--sources: no such kernel source at either revision: {', '.join(unknown)}")
    return base_src, head_src, names


def code_at(rev: str, names: list[str] | None, arch: str) -> tuple[dict, dict]:
    """({source: {kernel: code}} at rev, the same of the working tree) for the named kernel
    sources (None: every .cu of either); each side compiles the ones it has."""
    flags = build.spec(cuda=True).cuda_flags
    with tempfile.TemporaryDirectory() as tmp:
        base_src, head_src, names = both_sources(rev, names, Path(tmp))
        return tuple(compile_dir(src, [n for n in names if (src / n).exists()], arch, flags, Path(tmp) / tag)
                     for src, tag in ((base_src, "b"), (head_src, "h")))


def moved_sources(rev: str, names: list[str], arch: str) -> dict[str, bool]:
    """{source: whether any of its kernels' machine code differs} between rev and the working
    tree, for the named kernel sources (`ab` asks this of the sources of a kernel it flags)."""
    base, head = code_at(rev, names, arch)
    rows = compare(base, head)
    return {n: any(r.verdict != "identical" for r in rows if r.source == n) or n not in base or n not in head
            for n in names}


def arch_of(capability: tuple[int, int]) -> str:
    """nvcc's -arch for a compute capability, as the build targets it (9.0: sm_90a)."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


@dataclasses.dataclass
class Row:
    source: str
    kernel: str
    verdict: str        # identical, differs, new, gone
    base: int = 0       # instructions
    head: int = 0
    removed: int = 0    # base instructions gone or changed (differing)
    added: int = 0      # head instructions new or changed


def compare(base: dict, head: dict) -> list[Row]:
    rows = []
    for source in sorted(set(base) | set(head)):
        a, b = base.get(source, {}), head.get(source, {})
        for kernel in sorted(set(a) | set(b)):
            if kernel not in a:
                rows.append(Row(source, kernel, "new", head=len(b[kernel]) // INSTRUCTION))
            elif kernel not in b:
                rows.append(Row(source, kernel, "gone", base=len(a[kernel]) // INSTRUCTION))
            else:
                removed, added = differing(a[kernel], b[kernel])
                rows.append(Row(source, kernel, "identical" if removed == added == 0 else "differs",
                                len(a[kernel]) // INSTRUCTION, len(b[kernel]) // INSTRUCTION, removed, added))
    return rows


def markdown(rows: list[Row], base: str, arch: str) -> str:
    lines = [f"### Machine code, {base} → working tree ({arch})", "",
             "| source | kernel | instructions (base → head) | |", "| --- | --- | --- | --- |"]
    words = {"identical": lambda r: "identical", "new": lambda r: "new", "gone": lambda r: "gone",
             "differs": lambda r: f"**-{r.removed} +{r.added}**"}
    for r in sorted(rows, key=lambda r: (r.verdict == "identical", r.source, r.kernel)):
        lines.append(f"| {r.source} | `{r.kernel}` | {r.base or '-'} → {r.head or '-'} | {words[r.verdict](r)} |")
    moved = sum(r.verdict != "identical" for r in rows)
    lines += ["", f"{len(rows)} kernels: {len(rows) - moved} identical, {moved} moved"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = parser("sass", __doc__)
    p.add_argument("base", nargs="?", default="main", help="the git revision to compare with (default main)")
    p.add_argument("--arch", default="sm_90a", help="nvcc's -arch (default sm_90a; sm_80, sm_120, ...)")
    p.add_argument("--sources", nargs="+", metavar="FILE.cu", help="these kernel sources only (default every .cu)")
    p.add_argument("--json", type=Path, help="write the rows here too")
    args = p.parse_args(argv)
    try:
        sha = commit_of(args.base)
        base, head = code_at(sha, args.sources, args.arch)
    except Refusal as exc:
        print(f"python -m verify_attn sass: {exc}", file=sys.stderr)
        return 2
    rows = compare(base, head)
    print(markdown(rows, sha[:8], args.arch))
    if args.json:
        args.json.write_text(json.dumps({"base": sha, "arch": args.arch, "rows": [dataclasses.asdict(r) for r in rows]},
                                        indent=1))
    return 0

