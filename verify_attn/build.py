"""Build the extension with ninja through torch's extension builder, cached by content.

The cache (``$VERIFY_ATTN_CACHE``, default ``~/.cache/verify_attn``) lives outside the
checkout, because asv wipes its checkout between commits. Two levels:

* ``lib/<key>.so``: one linked library per distinct (sources, headers, flags, torch,
  CUDA, GPU architecture). A checkout whose key was built before loads in milliseconds.
* ``build/<target>/``: one ninja build directory per (flags, torch, CUDA, architecture).
  Sources are staged into it and rewritten only when their bytes differ, so ninja's
  timestamps stay meaningful across fresh checkouts: a change to one kernel file
  recompiles that file alone and relinks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

NAME = "verify_attn_ext"
CPU_SOURCES = ("binding.cpp", "cpu.cpp")
CUDA_SOURCES = ("binding_cuda.cpp", "naive.cu", "flash.cu")
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


def use_cuda() -> bool:
    """Build the CUDA backend when torch sees a GPU, unless VERIFY_ATTN_CPU_ONLY=1."""
    return os.environ.get("VERIFY_ATTN_CPU_ONLY") != "1" and torch.cuda.is_available()


def target() -> dict:
    """Everything besides the sources that the built library depends on."""
    cuda = use_cuda()
    arch = None
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}.{minor}"
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


def _inputs(cuda: bool) -> dict[str, bytes]:
    src = kernels_dir()
    names = list(CPU_SOURCES) + (list(CUDA_SOURCES) if cuda else [])
    names += sorted(p.name for p in src.glob("*.h"))
    return {name: (src / name).read_bytes() for name in names}


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    files = _inputs(tgt["cuda"] is not None)
    key = _digest(json.dumps(tgt, sort_keys=True).encode(), *(n.encode() + b"\0" + d for n, d in sorted(files.items())))
    return cache_dir() / "lib" / f"{NAME}-{key}.so"


def load(verbose: bool = False) -> Path:
    """Build if needed and load the extension into this process; returns the library path."""
    global _loaded
    if _loaded is not None:
        return _loaded
    lib = library_path()
    if lib.exists():
        torch.ops.load_library(str(lib))
    else:
        with _locked(cache_dir() / "lock"):
            if lib.exists():
                torch.ops.load_library(str(lib))
            else:
                _compile(lib, verbose)
    _loaded = lib
    return lib


def _compile(lib: Path, verbose: bool) -> None:
    from torch.utils import cpp_extension

    tgt = target()
    cuda = tgt["cuda"] is not None
    build = cache_dir() / "build" / _digest(json.dumps(tgt, sort_keys=True).encode())
    src = build / "src"
    src.mkdir(parents=True, exist_ok=True)
    files = _inputs(cuda)
    for name, data in files.items():
        _write_if_changed(src / name, data)
    sources = [str(src / n) for n in files if not n.endswith(".h")]
    _ensure_ninja_on_path()
    env_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = tgt["arch"]  # this GPU only: the key names it
    try:
        # Loads build/<target>/NAME.so into this process (registering the ops).
        cpp_extension.load(
            name=NAME,
            sources=sources,
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS),
            extra_include_paths=[str(src)],
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
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(".tmp")
    shutil.copyfile(build / f"{NAME}.so", tmp)
    os.replace(tmp, lib)  # complete or absent, never half-written


if __name__ == "__main__":
    import time

    t0 = time.perf_counter()
    path = load(verbose=True)
    print(f"{path} ({time.perf_counter() - t0:.2f} s)")
