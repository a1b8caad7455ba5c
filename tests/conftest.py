import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verify_attn import ops, registry
from verify_attn.candidate import Candidate

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def extension():
    ops.load()  # build once (cached by content) before any test


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def require(impl: str, device: str, inputs=None) -> None:
    """Skip, with the registry's reason, where impl cannot run on this device or these inputs."""
    reason = ops.unsupported(impl, device) if inputs is None else Candidate(impl).skip_reason(inputs)
    if reason:
        pytest.skip(reason)


COMPILED = [n for n, i in registry.IMPLS.items() if i.compiled]


ROOT = Path(__file__).resolve().parent.parent


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def copy_files(dest: Path, history: bool = False) -> Path:
    """This checkout's tracked and new files (the work tree as it is) copied to dest; results/
    and html/ only with history, else benchmarks/accepted.json emptied too (it names commits of
    the history a copy lacks)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        if (history or not f.startswith(("results/", "html/"))) and (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    if not history:
        (dest / "benchmarks" / "accepted.json").write_text("[]")
    return dest


def checkout_copy(tmp: Path, history: bool = False) -> tuple[Path, dict]:
    """A one-commit git repository holding this checkout's tracked and new files (results/
    and html/ only with history), and the environment for asv there: CPU, the tiny grid, a
    private build cache and HOME."""
    repo = copy_files(tmp / "repo", history)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (tmp / "home").mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(tmp / "home"), VERIFY_ATTN_CACHE=str(tmp / "cache"), VERIFY_ATTN_GRID="tiny",
               VERIFY_ATTN_DEVICE="cpu", VERIFY_ATTN_BASE_PYTHON=sys.executable)
    return repo, env
