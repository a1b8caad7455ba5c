"""A commit's kernels as a library of their own, beside the checkout's in one process.

kernels/ at a git revision is built with this checkout's spec (the registry's generated
bindings, the flags, the target) into its own op namespace: every TORCH_LIBRARY registration
is rewritten to the namespace and -Dverify_attn=NS moves the C++ namespace, so both builds
load into one process and their ops are timed in turn (``ab``'s base, the suite's anchor).
Only the implementations whose sources the revision has are built; kernels/ older than the
plan's path argument get the binding of that contract, without the pinned-path variants.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from . import build, registry

LIBRARY = re.compile(r"\b(TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?)\(\s*verify_attn\s*,")
BASE_NS = "va_base"  # a base commit's namespace (ab's, profile --base's): torch.ops.va_base.<impl>


class RevisionError(Exception):
    """git could not give the revision's kernels (no repository, an unknown revision)."""


def git(repo: Path, *args: str, text: bool = True):
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=text)
    if proc.returncode != 0:
        err = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise RevisionError(f"git {' '.join(args)}: {err.strip().splitlines()[-1] if err.strip() else 'failed'}")
    return proc.stdout


def renamed(source: bytes, ns: str) -> bytes:
    """A source with its op registrations moved to namespace ns (the C++ namespace moves by
    -Dverify_attn=ns; a TORCH_LIBRARY argument is stringified, which no macro reaches)."""
    return LIBRARY.sub(rf"\1({ns},", source.decode()).encode()


def library(repo: Path, rev: str, ns: str) -> tuple[build.Library, list[str]]:
    """rev's kernels/ as a library in namespace ns, and the implementations it holds."""
    listed = set(git(repo, "ls-tree", "-r", "--name-only", f"{rev}:kernels").split())
    if "binding.cpp" not in listed or "verify_attn.h" not in listed:
        raise RevisionError(f"{rev} has no kernels/binding.cpp: it predates the registry's op binding")
    legacy = b"kAnyPath" not in git(repo, "show", f"{rev}:kernels/verify_attn.h", text=False)
    cuda = build.use_cuda()
    # An implementation needs its first CUDA file there (the plan and launch) and takes those of
    # the rest that rev has: an older rev holds all of tc in tc.cu.
    impls = [dataclasses.replace(i, cuda_sources=tuple(s for s in i.cuda_sources if s in listed))
             for i in registry.IMPLS.values() if i.compiled and not (legacy and i.path != -1)
             and all(s in listed for s in (*i.cpu_sources, *(i.cuda_sources[:1] if cuda else ())))
             and (cuda or i.cpu_sources)]
    spec = build.spec(cuda, impls, legacy)
    names = [*spec.cpu_sources, *(spec.kernel_sources if cuda else ()), *sorted(n for n in listed if n.endswith(build.HEADER_SUFFIXES))]
    files = {n: renamed(git(repo, "show", f"{rev}:kernels/{n}", text=False), ns) for n in names}
    files.update({n: renamed(t.encode(), ns) for n, t in spec.generated.items()})
    define = (f"-Dverify_attn={ns}",)
    lib = build.Library(name=f"verify_attn_{ns}", files=files, sources=tuple(n for n in files if not n.endswith(build.HEADER_SUFFIXES)),
                        cxx_flags=build.CXX_FLAGS + define, cuda_flags=build.CUDA_FLAGS + define,
                        arch=build.target()["arch"])
    return lib, [i.name for i in impls]
