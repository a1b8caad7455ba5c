"""Child processes an interrupted verb must not leave behind.

backfill, detect, ab and run start asv, clones' builds and timing processes; on a GPU box an
orphan (an asv server, a setup_cache, nvcc) disturbs every later timing. Children start in
process groups of their own, and ``cleanup`` ends them, and whatever else still runs below the
verb, on SIGTERM, Ctrl-C or an error, before the verb's temp clones are removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every finally block (temp clones, children) runs."""


class Children:
    """Child processes started in sessions (process groups) of their own, so that an interrupted
    verb ends them with everything they started (asv's benchmark processes, setup_cache,
    builds, nvcc) instead of leaving them to disturb later timings. Thread-safe; once ending, it
    starts nothing more."""

    def __init__(self):
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        self.closing = False

    def popen(self, cmd, **kwargs) -> subprocess.Popen:
        with self.lock:
            if self.closing:
                raise KeyboardInterrupt("interrupted: starting nothing more")
            proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
            self.groups.add(proc.pid)
        return proc

    def run(self, cmd, cwd=None, env=None, check=False, text=True) -> subprocess.CompletedProcess:
        """subprocess.run(capture_output=True) with the child in its own, tracked group."""
        proc = self.popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)
        out, err = proc.communicate()
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def end(self, grace: float = 5.0) -> None:
        """SIGTERM every group started here, SIGKILL what is left after grace seconds."""
        with self.lock:
            self.closing = True
            groups = set(self.groups)
        # Taken first: a descendant in a session of its own (asv's forkserver) is outside the
        # group, and once its parent dies it is no longer found below anything of ours.
        below = {p for g in groups for p in descendants(g)}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [g for g in groups if _signal_group(g, sig)]
            deadline = time.monotonic() + grace
            while alive and time.monotonic() < deadline:
                time.sleep(0.05)
                alive = [g for g in alive if _signal_group(g, 0)]
            if not alive:
                break
            groups = set(alive)
        _end_pids(below, grace)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send sig to a process group; whether any of it was there. Reaps a finished leader."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of pid (default: this process), from /proc (empty elsewhere)."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _end_pids(pids, grace: float) -> None:
    """SIGTERM then SIGKILL these processes, each while it is still running."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            for pid in pids:  # our own children: reaped, not left as zombies
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
            time.sleep(0.05)
        if not pids:
            return


def end_descendants(grace: float = 3.0) -> None:
    """SIGTERM then SIGKILL whatever this process still has running below it (a build's ninja and
    nvcc, started by torch in this process group)."""
    _end_pids(descendants(), grace)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@contextlib.contextmanager
def cleanup():
    """Within: SIGTERM raises Terminated, SIGINT KeyboardInterrupt, each once the children are
    ended; yields a Children
    for what the verb starts. On leaving, normally or not, every group started through it is
    ended, and on an interrupt also whatever else this process still runs below it,
    before the enclosing with-blocks (temp clones) are left."""
    kids = Children()

    def on_signal(signum, frame):
        # Here, before any frame unwinds: a subprocess.run interrupted kills its own child only,
        # and what that child started would no longer be found below this process.
        kids.end()
        end_descendants()
        raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield kids
    except KeyboardInterrupt:  # Terminated too; an ordinary error ends the groups only
        kids.end()
        end_descendants()
        raise
    finally:
        kids.end()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
