"""Build the extension with ninja through torch's extension builder, cached by content.

The cache (``$VERIFY_ATTN_CACHE``, default ``~/.cache/verify_attn``) lives outside the
checkout, because asv wipes its checkout between commits. Two levels:

* ``lib/<key>.so``: one linked library per distinct (sources, headers, flags, torch,
  CUDA, GPU architecture). A checkout whose key was built before loads in milliseconds.
* ``build/<target>/``: one ninja build directory per (flags, torch, CUDA, architecture).
  Sources are staged into it and rewritten only when their bytes differ, so ninja's
  timestamps stay meaningful across fresh checkouts: a change to one kernel file
  recompiles that file alone and relinks.

What is compiled comes from one ``Spec``, made from the implementation registry: the
kernels' sources, the flags, and the generated binding that registers one op per
implementation. The resource report (verify_attn.resources) compiles from the same spec.

An optional peer with its own sources and flags (FlashMLA: verify_attn/flashmla.py) builds
a second library through the same cache, lock and atomic write: a ``Library`` and
``load_library``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import torch

from . import registry

NAME = "verify_attn_ext"
CXX_FLAGS = ("-O3",)
CUDA_FLAGS = ("-O3", "-lineinfo")

_loaded: Path | None = None


def kernels_dir() -> Path:
    """The CUDA and C++ sources: inside the installed package, else the repository's."""
    here = Path(__file__).resolve().parent
    installed = here / "kernels"
    return installed if installed.is_dir() else here.parent / "kernels"


def cache_dir() -> Path:
    return Path(os.environ.get("VERIFY_ATTN_CACHE", Path.home() / ".cache" / "verify_attn"))


HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inl")


def headers(root: Path | None = None) -> list[str]:
    """Every header under kernels/ (subfolders too), as paths relative to it: all of them are
    staged into each build and keyed, so a change to any one rebuilds."""
    root = root or kernels_dir()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.suffix in HEADER_SUFFIXES and p.is_file())


def use_cuda() -> bool:
    """Build the CUDA backend when torch sees a GPU, unless VERIFY_ATTN_CPU_ONLY=1."""
    return os.environ.get("VERIFY_ATTN_CPU_ONLY") != "1" and torch.cuda.is_available()


def target() -> dict:
    """Everything besides the sources that the built library depends on."""
    cuda = use_cuda()
    arch = None
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        # 9.0 builds for sm_90a, where tc has its wgmma path (sm_90a code runs on 9.0 only).
        arch = f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "arch": arch,
        "cxx_flags": CXX_FLAGS,
        "cuda_flags": CUDA_FLAGS if cuda else None,
    }


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:20]


@dataclasses.dataclass(frozen=True)
class Spec:
    """What one build compiles: sources by name (files of kernels/ and generated text) and flags."""

    cuda: bool
    cpu_sources: tuple[str, ...]     # kernels/ C++ files: the binding and the CPU twins
    kernel_sources: tuple[str, ...]  # kernels/ CUDA files, each compiled on its own by nvcc
    generated: dict                  # name -> text: the ops of the registry's implementations
    cxx_flags: tuple[str, ...] = CXX_FLAGS
    cuda_flags: tuple[str, ...] = CUDA_FLAGS

    def files(self) -> dict[str, bytes]:
        """Every input of the build, headers included, by name."""
        src = kernels_dir()
        names = list(self.cpu_sources) + (list(self.kernel_sources) if self.cuda else [])
        names += headers(src)
        files = {name: (src / name).read_bytes() for name in names}
        files.update({name: text.encode() for name, text in self.generated.items()})
        return files


def _unique(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def spec(cuda: bool | None = None, impls=None, legacy: bool = False) -> Spec:
    """The build of the registry's compiled implementations (or of these entries), with CUDA
    or (False) CPU only; legacy: see _cuda_binding."""
    cuda = use_cuda() if cuda is None else cuda
    impls = [i for i in registry.IMPLS.values() if i.compiled] if impls is None else impls
    generated = {"impls.cpp": _cpu_binding(impls)}
    if cuda:
        generated["impls_cuda.cpp"] = _cuda_binding(impls, legacy)
    return Spec(cuda, _unique(["binding.cpp", *(s for i in impls for s in i.cpu_sources)]),
                _unique(s for i in impls for s in i.cuda_sources), generated)


def _cpu_binding(impls) -> str:
    cpu = [i for i in impls if i.cpu_sources]
    lines = ["// Generated by verify_attn/build.py from verify_attn/registry.py: one op per implementation.",
             '#include <torch/library.h>', '#include "binding.h"', "namespace verify_attn {"]
    lines += [f"void {s}_cpu(const Params& p);" for s in _unique(i.cpp for i in cpu)]
    lines.append("TORCH_LIBRARY_FRAGMENT(verify_attn, m) {")
    for i in impls:
        lines.append(f'  m.def((std::string("{i.name}") + kOpArgs).c_str());')
        if i.cuda_sources:
            lines.append(f'  m.def((std::string("{i.name}_plan") + kPlanArgs).c_str());')
    lines += ["}", "TORCH_LIBRARY_IMPL(verify_attn, CPU, m) {"]
    lines += [f'  m.impl("{i.name}", &run_cpu<{i.cpp}_cpu>);' for i in cpu]
    lines += ["}", "}  // namespace verify_attn", ""]
    return "\n".join(lines)


def _cuda_binding(impls, legacy: bool = False) -> str:
    """legacy: for kernels/ older than the plan's path argument (a revision built beside the
    checkout, verify_attn.revision), whose plans take no path and return no path."""
    cuda = [i for i in impls if i.cuda_sources]
    lines = ["// Generated by verify_attn/build.py from verify_attn/registry.py: one op per implementation.",
             '#include <torch/library.h>', '#include "binding_cuda.h"', "namespace verify_attn {"]
    path_arg = "" if legacy else ", int path"
    for s in _unique(i.cpp for i in cuda):
        lines += [f"Plan plan_{s}(const Params& p, int num_sms{path_arg});",
                  f"int launch_{s}(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);"]
    lines.append("TORCH_LIBRARY_IMPL(verify_attn, CUDA, m) {")
    args = ("const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices, "
            "const at::Tensor& parent, const at::Tensor& prefix_lens, double scale")
    for i in cuda:
        path = "" if legacy else f"{i.path}, "
        lines.append(f'  m.impl("{i.name}", []({args}, at::Tensor& out, at::Tensor& lse) {{\n'
                     f'    run_cuda(plan_{i.cpp}, launch_{i.cpp}, {path}"{i.name}", q, kv, kv_indices, parent, prefix_lens, '
                     f'scale, out, lse);\n  }});')
        lines.append(f'  m.impl("{i.name}_plan", []({args}, const at::Tensor& out, const at::Tensor& lse) {{\n'
                     f'    return plan_cuda(plan_{i.cpp}, {path}q, kv, kv_indices, parent, prefix_lens, scale, out, lse);\n  }});')
    lines += ["}", "}  // namespace verify_attn", ""]
    return "\n".join(lines)


@contextlib.contextmanager
def _locked(build: Path):
    """Held while a build directory is in use: one builder each, several directories at once."""
    path = build.with_suffix(".lock")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def busy(build: Path) -> bool:
    """Whether a builder holds build's lock (_locked) right now."""
    path = build.with_suffix(".lock")
    if not path.exists():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.exists() and path.read_bytes() == data:
        return  # keep the old timestamp: ninja then knows nothing changed
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _ensure_ninja_on_path() -> None:
    if shutil.which("ninja"):
        return
    try:
        import ninja  # the PyPI package ships the binary
    except ImportError as exc:
        raise RuntimeError("verify_attn needs ninja: pip install ninja") from exc
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def library_path() -> Path:
    """Where the library for the current sources and target lives (built or not)."""
    tgt = target()
    files = spec(tgt["cuda"] is not None).files()
    key = _digest(json.dumps(tgt, sort_keys=True).encode(), *(n.encode() + b"\0" + d for n, d in sorted(files.items())))
    return cache_dir() / "lib" / f"{NAME}-{key}.so"


def load(verbose: bool = False) -> Path:
    """Build if needed and load the extension into this process; returns the library path."""
    global _loaded
    if _loaded is not None:
        return _loaded
    lib = library_path()
    if not lib.exists():
        with _locked(_build_dir()):
            if not lib.exists():
                _compile(lib, verbose)
                _loaded = lib
                return lib  # ninja's build loaded it already
    _load_trusted(lib)
    _loaded = lib
    return lib


def _untrusted(path: Path) -> str | None:
    """Why a cached library or its folder must not be loaded, or None: it must be a plain file
    (no link) that only this user can write, in a folder that only this user can write. A
    library built by another account (a pull request's runner user beside main's) is refused:
    loading runs its code."""
    for p in (path.parent, path):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return f"{p} is a symbolic link"
        if st.st_uid != os.geteuid():
            return f"{p} belongs to uid {st.st_uid}, not this user ({os.geteuid()})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{p} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _load_trusted(lib: Path) -> None:
    why = _untrusted(lib)
    if why:
        raise RuntimeError(f"refusing to load the cached library {lib}: {why}; point VERIFY_ATTN_CACHE at a "
                           f"folder only this user can write (each CI job its own)")
    torch.ops.load_library(str(lib))


def _build_dir() -> Path:
    return cache_dir() / "build" / _digest(json.dumps(target(), sort_keys=True).encode())


def _compile(lib: Path, verbose: bool) -> None:
    tgt = target()
    cuda = tgt["cuda"] is not None
    build = _build_dir()
    files = spec(cuda).files()
    _ninja(NAME, build, files, [n for n in files if not n.endswith(HEADER_SUFFIXES)], CXX_FLAGS, CUDA_FLAGS, (),
           tgt["arch"] if cuda else None, verbose)
    _publish(build / f"{NAME}.so", lib)


def _ninja(name: str, build: Path, files: dict[str, bytes], sources, cxx_flags, cuda_flags, include_dirs,
           arch: str | None, verbose: bool) -> None:
    """Stage files into build/src (rewritten only when their bytes differ) and build the
    library build/<name>.so with ninja, loading it into this process (registering its ops).
    arch: TORCH_CUDA_ARCH_LIST for this build alone ("9.0", "9.0a"); None: no CUDA."""
    from torch.utils import cpp_extension

    src = build / "src"
    src.mkdir(parents=True, exist_ok=True)
    for fname, data in files.items():
        (src / fname).parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(src / fname, data)
    _ensure_ninja_on_path()
    # torch's own baton: a build killed midway leaves build/lock behind, and every later load
    # would wait on it for ever. Our lock (_locked) is held here, so no builder of ours is using it.
    (build / "lock").unlink(missing_ok=True)
    cuda = arch is not None
    env_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch  # this architecture only: the key names it
    try:
        cpp_extension.load(
            name=name,
            sources=[str(src / n) for n in sources],
            extra_cflags=list(cxx_flags),
            extra_cuda_cflags=list(cuda_flags),
            extra_include_paths=[str(src), *include_dirs],
            build_directory=str(build),
            with_cuda=cuda,
            is_python_module=False,
            verbose=verbose,
        )
    finally:
        if cuda:
            if env_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = env_arch


def _publish(built: Path, lib: Path) -> None:
    lib.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = lib.with_suffix(".tmp")
    shutil.copyfile(built, tmp)
    os.replace(tmp, lib)  # complete or absent, never half-written


@dataclasses.dataclass(frozen=True)
class Library:
    """A second extension library, cached by content like the main one: an optional peer's
    sources with its own flags. ``files`` are staged by name into the build directory
    (sources and the headers of ours they include); ``include_dirs`` are read in place (a
    checkout's headers), so ``stand_in`` must change whenever what they hold does."""

    name: str                           # the library's name: lib/<name>-<key>.so, build/<name>-<target>/
    files: dict                         # name -> bytes
    sources: tuple[str, ...]            # the names of files that are compiled (.cu by nvcc)
    include_dirs: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = CXX_FLAGS
    cuda_flags: tuple[str, ...] = CUDA_FLAGS
    arch: str | None = None             # TORCH_CUDA_ARCH_LIST, e.g. "9.0a"; None: no CUDA
    stand_in: bytes = b""               # digest input standing for the include_dirs' contents

    def target(self) -> dict:
        return {
            "torch": torch.__version__,
            "cuda": torch.version.cuda if self.arch else None,
            "arch": self.arch,
            "cxx_flags": list(self.cxx_flags),
            "cuda_flags": list(self.cuda_flags) if self.arch else None,
            "include_dirs": list(self.include_dirs),
        }

    def path(self) -> Path:
        """Where this library lives in the cache (built or not)."""
        key = _digest(json.dumps(self.target(), sort_keys=True).encode(), self.stand_in,
                      *(n.encode() + b"\0" + d for n, d in sorted(self.files.items())))
        return cache_dir() / "lib" / f"{self.name}-{key}.so"

    def build_dir(self) -> Path:
        """Where it is built: one directory per target, its lock beside it."""
        return cache_dir() / "build" / f"{self.name}-{_digest(json.dumps(self.target(), sort_keys=True).encode())}"


_libraries: dict[str, Path] = {}


def load_library(library: Library, verbose: bool = False) -> Path:
    """Build if needed (under its lock) and load a ``Library`` into this process, once."""
    lib = library.path()
    if _libraries.get(library.name) == lib:
        return lib
    if not lib.exists():
        build = library.build_dir()
        with _locked(build):
            if not lib.exists():
                _ninja(library.name, build, library.files, library.sources, library.cxx_flags,
                       library.cuda_flags, library.include_dirs, library.arch, verbose)
                _publish(build / f"{library.name}.so", lib)
                _libraries[library.name] = lib
                return lib  # ninja's build loaded it already
    _load_trusted(lib)
    _libraries[library.name] = lib
    return lib
