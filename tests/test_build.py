"""The build is cached by content: nothing changed loads at once, one changed kernel file
recompiles that file alone, and a fresh checkout of unchanged sources rebuilds nothing."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from verify_attn import build

ROOT = Path(__file__).resolve().parent.parent


def _load_in_fresh_process(kernels: Path, cache: Path) -> tuple[str, float]:
    code = ("import time, torch; from verify_attn import build; build.kernels_dir = lambda: __import__('pathlib')"
            f".Path({str(kernels)!r}); t = time.perf_counter(); p = build.load(); "
            "print(p); print(time.perf_counter() - t)")
    env = dict(os.environ, VERIFY_ATTN_CACHE=str(cache), VERIFY_ATTN_CPU_ONLY="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True,
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
