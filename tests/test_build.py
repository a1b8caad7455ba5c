"""The build is cached by content: nothing changed loads at once, one changed kernel file
recompiles that file alone, and a fresh checkout of unchanged sources rebuilds nothing."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verify_attn import build

ROOT = Path(__file__).resolve().parent.parent


def _load_in_fresh_process(kernels: Path, cache: Path) -> tuple[str, float]:
    code = ("import time, torch; from verify_attn import build; build.kernels_dir = lambda: __import__('pathlib')"
            f".Path({str(kernels)!r}); t = time.perf_counter(); p = build.load(); "
            "print(p); print(time.perf_counter() - t)")
    env = dict(os.environ, VERIFY_ATTN_CACHE=str(cache), VERIFY_ATTN_CPU_ONLY="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True, timeout=900,
                         text=True).stdout.split()
    return out[0], float(out[1])


def _compiled(cache: Path) -> list[str]:
    """Objects ninja compiled, by its log (the link step excluded)."""
    log = next(cache.glob("build/*/.ninja_log")).read_text().splitlines()[1:]
    return [line.split("\t")[3] for line in log if line.split("\t")[3].endswith(".o")]


def test_build_cache_by_content(tmp_path):
    cache = tmp_path / "cache"
    checkout1 = tmp_path / "a" / "kernels"
    shutil.copytree(ROOT / "kernels", checkout1)
    lib1, _ = _load_in_fresh_process(checkout1, cache)
    assert sorted(_compiled(cache)) == ["binding.o", "cpu.o", "impls.o"]

    lib_again, seconds = _load_in_fresh_process(checkout1, cache)
    assert lib_again == lib1 and seconds < 1.0  # nothing changed: load only

    time.sleep(1.1)  # a later checkout: every file newer than the objects
    checkout2 = tmp_path / "b" / "kernels"
    shutil.copytree(ROOT / "kernels", checkout2)
    (checkout2 / "cpu.cpp").write_text((checkout2 / "cpu.cpp").read_text() + "\n// changed\n")
    for f in checkout2.iterdir():
        os.utime(f)
    # A build killed midway leaves torch's baton behind; the next build must not wait on it.
    (next(cache.glob("build/*/.ninja_log")).parent / "lock").write_text("")
    lib2, _ = _load_in_fresh_process(checkout2, cache)
    assert lib2 != lib1
    assert sorted(_compiled(cache)) == ["binding.o", "cpu.o", "cpu.o", "impls.o"]  # cpu.cpp alone again

    lib1_again, seconds = _load_in_fresh_process(checkout1, cache)  # back to the first sources
    assert lib1_again == lib1 and seconds < 1.0
    assert sorted(_compiled(cache)) == ["binding.o", "cpu.o", "cpu.o", "impls.o"]


def test_library_key_covers_headers(tmp_path, monkeypatch):
    kernels = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", kernels)
    monkeypatch.setattr(build, "kernels_dir", lambda: kernels)
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path / "cache"))
    before = build.library_path()
    (kernels / "verify_attn.h").write_text((kernels / "verify_attn.h").read_text() + "\n")
    assert build.library_path() != before
    (kernels / "common").mkdir()
    (kernels / "common" / "merge.cuh").write_text("// a header in a subfolder\n")
    in_subfolder = build.library_path()
    assert in_subfolder != before and "common/merge.cuh" in build.spec().files()


def test_a_cached_library_that_others_can_write_is_refused(tmp_path, monkeypatch):
    """Loading a library runs its code: one in a folder or file that another user can write,
    or a link, is refused with the path and the reason, never loaded."""
    monkeypatch.setenv("VERIFY_ATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VERIFY_ATTN_CPU_ONLY", "1")
    monkeypatch.setattr(build, "_loaded", None)
    lib = build.library_path()
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"not a library")
    os.chmod(lib, 0o666)
    with pytest.raises(RuntimeError, match=r"refusing to load .*writable by other users"):
        build.load()
    os.chmod(lib, 0o644)
    os.chmod(lib.parent, 0o777)
    with pytest.raises(RuntimeError, match=r"refusing to load .*writable by other users"):
        build.load()
    os.chmod(lib.parent, 0o755)
    target = tmp_path / "elsewhere.so"
    lib.rename(target)
    lib.symlink_to(target)
    with pytest.raises(RuntimeError, match="symbolic link"):
        build.load()
    assert build._loaded is None


def test_prebuild_builds_what_a_later_load_finds(tmp_path, monkeypatch):
    """The suite's builders run in processes of their own; a load afterwards compiles nothing."""
    from verify_attn import prebuild

    cache = tmp_path / "cache"
    for name, value in (("VERIFY_ATTN_CACHE", str(cache)), ("VERIFY_ATTN_CPU_ONLY", "1"), ("VERIFY_ATTN_ANCHOR", "off")):
        monkeypatch.setenv(name, value)
    env = dict(os.environ)
    procs = prebuild.start(("extension", "anchor", "flashmla"))
    assert len(procs) == 1  # the extension: no anchor (off), no FlashMLA on the CPU
    # While its builder holds the build directory's lock, a second start (the next class's
    # set-up) leaves it to that builder instead of starting one that would only wait.
    deadline = time.monotonic() + 120
    while not build.busy(build._build_dir()) and procs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert build.busy(build._build_dir()), "the builder holds its lock while it compiles (tens of seconds)"
    assert prebuild.start(("extension",)) == []
    assert procs[0].wait(timeout=600) == 0
    assert not build.busy(build._build_dir())
    assert build.library_path().exists()
    assert prebuild.start(("extension", "anchor", "flashmla")) == []  # built: nothing to start
    bad = subprocess.run([sys.executable, "-m", "verify_attn.prebuild", "everything"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "extension, anchor, flashmla, resources" in bad.stderr
