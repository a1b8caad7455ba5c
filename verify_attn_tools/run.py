"""asv over commits on this machine's default device, then publish the site.

RANGE is any asv range (default HEAD^!: the current commit). Each commit is built in its
own environment over this interpreter's torch (asv_plugins/reuse_env.py) with 16 samples a
point (calls of tc and tc_mma under 0.1 ms: 16 in each of three processes). A machine the
repository tracks (it has results/<machine>/) records there and
publishes html/; any other machine records into .asv/local/ and publishes .asv/local/html,
so a newcomer's run leaves the checkout's committed files alone (--track makes this machine
a tracked one). asv runs in a process group of its own: Ctrl-C or SIGTERM ends it with every
benchmark process it started. asv shows a benchmark's output only when it ends, so the suite's own
progress lines are followed meanwhile.

asv's complete output goes to .asv/logs/run-<date>.log (git-ignored), the suite's progress lines
in their places; the terminal gets one line per benchmark class and set-up, with its time, the
progress lines, every failure in full and a summary (--verbose: asv's output as it comes).
"""

from __future__ import annotations

import codecs
import datetime
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from verify_attn import build, prebuild, suite
from verify_attn.machine import asv_machine_name

from . import ROOT, publish, tracked
from .children import cleanup
from .cli import Refusal, parser


ASV = [sys.executable, "-m", "asv"]
LOGS = ROOT / ".asv" / "logs"  # git-ignored (.gitignore: .asv/); one file a run, none removed


def register_machine(name: str) -> None:
    """Register this box with asv under NAME, the name alone. asv copies every field of a
    machine entry into each result's parameters and publish draws one series per parameter
    set, so a field that differs between two lent hosts of the same GPU (RAM, CPU count)
    would cut the history in two (tests/test_results.py checks one set per machine).
    ``asv machine --yes`` would keep fields stored earlier, so the entry is replaced."""
    from asv.machine import MachineCollection

    MachineCollection.save(name, {"machine": name})


def follow(path, stop: threading.Event, say) -> None:
    """Pass each line appended to path to say until stop is set (tail -f)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    with open(path) as f:
        while not stop.is_set():
            line = f.readline()
            if line:
                say(line.rstrip("\n"))
            else:
                time.sleep(0.5)


def _print(text: str, file=None) -> None:
    """One line to file (default stdout), asv's "·" replaced where its encoding lacks it."""
    file = file or sys.stdout
    try:
        print(text, file=file, flush=True)
    except UnicodeEncodeError:
        enc = file.encoding or "ascii"
        print(text.encode(enc, "replace").decode(enc), file=file, flush=True)


def seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


# asv's log records (asv_runner.console.Log): "[ 12.34%] ··· text", the percentage once the
# benchmarks run, one "·" a level; a record's further lines are indented, and a record ends
# without a newline, which the next one writes first.
RECORD = re.compile(r"^(?:\[\s*(?P<pct>[\d.]+)%\] )?(?P<dots>·+) (?P<body>.*)$")
RESULT = re.compile(r"^(?P<name>\.\.\.\w+(?:\.\w+)*|\w+(?:\.\w+)+)(?:\s+(?P<status>\S.*?))?\s*$")
SETUP = re.compile(r"^Setting up (?P<key>\S+)(?:\s+(?P<status>\S+))?\s*$")


class Terse:
    """asv's output for the terminal, condensed: asv's outline (environments, discovery, the
    build, each commit) as it says it; per benchmark class one line with its counts and time,
    per set-up (setup_cache) one; a failed benchmark's or set-up's lines in full, and lines
    that are not asv's log (an asv traceback); the suite's progress lines; a summary. asv's
    result tables, n/a cells and all, are left to the log. A record long under way is
    announced when relay says so (pending: a slow class, a set-up that builds). Thread-safe."""

    def __init__(self, say=_print, clock=time.monotonic):
        self.say, self.clock = say, clock
        self.lock = threading.RLock()
        self.begun = self.mark = clock()
        self.pct = " 0.00"
        self.group: dict | None = None  # the class under way: key, label, start, counts
        self.totals: Counter = Counter()
        self.failed: list[str] = []
        self.showing = False  # the current record's further lines are shown
        self.details_next = False  # the next unknown record is the last result's table
        self.announced: str | None = None
        self.tail = ""  # the record under way, its end not written yet

    def progress(self, line: str) -> None:
        with self.lock:
            self.say(line)

    def _end_group(self) -> None:
        g, self.group = self.group, None
        if g:
            c = g["counts"]
            counts = ", ".join(f"{c[k]} {k}" for k in ("ok", "n/a", "failed") if c[k])
            self.say(f"[{g['pct']}%] {g['label']}: {counts} ({seconds(g['end'] - g['start'])})")

    @staticmethod
    def _class(name: str) -> tuple[str, str] | None:
        """(class, module.Class) of a benchmark's name; None where asv cut it short past its
        class (asv runs a class's benchmarks one after another: the class under way)."""
        cut = name.startswith("...")
        parts = name[3:].split(".") if cut else name.split(".")
        if len(parts) < (3 if cut else 2):
            return None
        return parts[-2], ("..." if cut else "") + ".".join(parts[:-1])

    def _group(self, name: str) -> dict:
        found = self._class(name)
        if found is None and self.group:
            return self.group
        key, label = found or (name, name)
        if self.group and self.group["key"] != key:
            self._end_group()
        if not self.group:
            self.group = {"key": key, "label": label, "start": self.mark, "end": self.mark, "pct": self.pct,
                          "counts": Counter()}
        elif self.group["label"].startswith("...") and not label.startswith("..."):
            self.group["label"] = label  # the class's whole name, where another of its benchmarks shows it
        return self.group

    def feed(self, text: str) -> None:
        """asv's output as it comes: complete lines taken, the start of the next record noted."""
        with self.lock:
            *lines, self.tail = (self.tail + text).split("\n")
            for line in lines:
                self._complete(line.rstrip("\r"))
            if self.tail:
                self.begins(self.tail)

    def idle(self) -> None:
        """Nothing more came for a while: say what the unfinished record is doing."""
        if self.tail:
            self.pending(self.tail)

    def _complete(self, text: str) -> None:
        announced, self.announced = self.announced, None
        m = RECORD.match(text)
        if not m:
            if text[:1].isspace() or not text.strip():
                if self.showing:
                    self.say(text)
            else:  # not asv's log: asv's own traceback, a warning
                self.say(text)
                self.showing = True
            return
        if m["pct"]:
            self.pct = f"{float(m['pct']):5.2f}"
        body, now = m["body"], self.clock()
        details, self.details_next = self.details_next, False
        if len(m["dots"]) <= 2:  # the outline: a commit, an environment, a build
            self._end_group()
            if text != announced:
                self.say(text)
            self.showing, self.mark = True, now
            return
        setup = SETUP.match(body)
        if setup:
            self._end_group()
            status = setup["status"] or "?"
            self.say(f"[{self.pct}%] set-up {setup['key']}: {status} ({seconds(now - self.mark)})")
            self.showing, self.mark = status != "ok", now
            if status != "ok":
                self.failed.append(f"set-up {setup['key']}")
            return
        if body.startswith("Running ("):  # a round of a benchmark that has more
            self.showing = False
            return
        result = RESULT.match(body)
        if result and result["status"]:
            name, status = result["name"], result["status"]
            bad = "failed" in status or status.startswith("skipped")
            kind = "failed" if bad else "n/a" if status == "n/a" else "ok"
            group = self._group(name)
            group["counts"][kind] += 1
            group.update(end=now, pct=self.pct)
            self.totals[kind] += 1
            self.mark, self.showing, self.details_next = now, bad, True
            if bad:
                self.say(text)
                self.failed.append(f"{name} ({status})")
            return
        if details:  # the last result's table (its stderr below where it failed)
            if self.showing:
                self.say(text)
            return
        self.say(text)  # anything else asv says at this level
        self.showing = True

    def begins(self, text: str) -> None:
        """The start of a record, its end not written yet (perhaps not all of its start either):
        the class under way ends where a set-up or a step of the outline begins, so that its
        line comes before their progress lines."""
        with self.lock:
            m = RECORD.match(text)
            if m and (len(m["dots"]) <= 2 or SETUP.match(m["body"])):
                self._end_group()

    def pending(self, text: str) -> None:
        """The start of a record that has not ended for a while: say what is under way (a
        class's first benchmark, a set-up, a step of the outline)."""
        with self.lock:
            if text == self.announced:
                return
            m = RECORD.match(text)
            if not m:
                return
            self.announced = text
            if m["pct"]:
                self.pct = f"{float(m['pct']):5.2f}"
            setup, result = SETUP.match(m["body"]), RESULT.match(m["body"])
            if len(m["dots"]) <= 2:
                self.say(text)
            elif setup and not setup["status"]:
                self._end_group()
                self.say(f"[{self.pct}%] set-up {setup['key']} ...")
            elif result and not result["status"]:
                found = self._class(result["name"])
                if self.group and found is not None and found[0] != self.group["key"]:
                    self._end_group()
                if not self.group:
                    self.say(f"[{self.pct}%] {self._group(result['name'])['label']} ...")

    def close(self, status: int | None) -> None:
        with self.lock:
            if self.tail:
                self._complete(self.tail)
                self.tail = ""
            self._end_group()
            t = self.totals
            counts = ", ".join(f"{t[k]} {k}" for k in ("ok", "n/a", "failed") if t[k]) or "none"
            end = "interrupted" if status is None else f"asv exited {status}"
            self.say(f"benchmarks: {counts}; {end} after {seconds(self.clock() - self.begun)}")
            for name in self.failed:
                self.say(f"  failed: {name}")


class Verbose:
    """asv's output as it comes, to stdout; the progress lines to stderr (as before the log)."""

    def feed(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def idle(self) -> None:
        pass

    def progress(self, line: str) -> None:
        _print(line, sys.stderr)

    def close(self, status) -> None:
        pass


class Log:
    """asv's output byte for byte, the progress lines put in between two of its lines."""

    def __init__(self, path: Path, command: list[str]):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.f = open(path, "wb")
        self.lock = threading.Lock()
        self.midline = False
        self.held: list[bytes] = []
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.f.write(f"# {stamp}: {' '.join(command)}\n".encode())

    def asv(self, data: bytes) -> None:
        with self.lock:
            cut = data.rfind(b"\n") + 1
            if cut:
                self.f.write(data[:cut] + b"".join(self.held))
                self.held, self.midline = [], False
            if data[cut:]:
                self.f.write(data[cut:])
                self.midline = True
            self.f.flush()

    def note(self, line: str) -> None:
        with self.lock:
            entry = (line + "\n").encode()
            if self.midline:
                self.held.append(entry)
            else:
                self.f.write(entry)
                self.f.flush()

    def close(self, end: str) -> None:
        with self.lock:
            self.f.write((b"\n" if self.midline else b"") + b"".join(self.held) + f"# {end}\n".encode())
            self.f.close()


def new_log(command: list[str]) -> Log:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = LOGS / f"run-{stamp}{'' if n == 1 else f'-{n}'}.log"
        if not path.exists():
            return Log(path, command)
    raise RuntimeError(f"no free log name in {LOGS}")


def relay(stream, log: Log, out, stable: float = 3.0) -> None:
    """asv's merged output into the log and to out until it ends; out.idle() when nothing came
    for `stable` seconds. The pipe is drained whatever out does: an error of out's ends out,
    not asv (which a full pipe would stop)."""
    fd = stream.fileno()
    decode = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        ready, _, _ = select.select([fd], [], [], stable)
        data = os.read(fd, 1 << 16) if ready else None
        if data == b"":
            break
        if data:
            log.asv(data)
        try:
            if out is not None:
                out.feed(decode.decode(data)) if data else out.idle()
        except Exception as exc:  # noqa: BLE001 - reported, and the log still gets everything
            print(f"python -m verify_attn run: the terminal's summary stopped ({exc!r}); the log has asv's output",
                  file=sys.stderr, flush=True)
            out = None


def checkout_measured(range_: list[str]) -> bool:
    """Whether asv measures exactly the checkout's kernels: the range is HEAD alone and the
    working tree's kernels/ is HEAD's (the libraries are keyed by content, so a build from the
    checkout is the one asv's benchmarks would make)."""
    if range_ != ["HEAD^!"]:
        return False
    done = subprocess.run(["git", "status", "--porcelain", "--", "kernels"], cwd=ROOT, capture_output=True, text=True)
    return done.returncode == 0 and not done.stdout.strip()


def shown(path: Path) -> str:
    """path from the working directory where it lies below it (bench.sh's: the checkout), else whole."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def main(argv=None) -> int:
    p = parser("run", __doc__)
    p.add_argument("range", nargs="*", default=["HEAD^!"], help="asv commit range (default HEAD^!)")
    p.add_argument("--bench", "-b", action="append", help="only benchmarks matching this regex (asv -b)")
    p.add_argument("--no-publish", action="store_true", help="record results only")
    p.add_argument("--track", action="store_true",
                   help="record into results/<machine>/ even though the repository does not track this machine yet")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show asv's whole output as it comes (it always goes to .asv/logs/run-<date>.log)")
    args = p.parse_args(argv)
    try:
        import asv  # noqa: F401
    except ImportError:
        raise Refusal(f"asv is not installed for {sys.executable}: run `bash bench.sh`, which sets it up") from None
    machine = asv_machine_name(suite.device())
    register_machine(machine)
    local = not (tracked(machine) or args.track)
    config = ["--config", str(publish.local_config())] if local else []
    if local:
        print(f"{machine} is not a machine this repository tracks: results go to .asv/local/results and the site to "
              ".asv/local/html (--track records into results/ instead)", file=sys.stderr, flush=True)
    bench = [a for b in args.bench or [] for a in ("-b", b)]
    command = [*ASV, *config, "run", "--machine", machine, "--record-samples", *bench, *args.range]
    log = new_log(command)
    out = Verbose() if args.verbose else Terse()
    if not args.verbose:
        print(f"asv's complete output goes to {shown(log.path)} (--verbose shows it here too)", file=sys.stderr,
              flush=True)

    def say(line):
        log.note(line)
        out.progress(line)

    stop = threading.Event()
    threading.Thread(target=follow, args=(build.cache_dir() / "progress.log", stop, say), daemon=True).start()
    status, reader = None, None
    try:
        # asv in a process group of its own: an interrupt ends it with its benchmark processes.
        with cleanup() as kids:
            if checkout_measured(args.range) and not args.bench:
                # A whole suite needs every build: they start before asv's own preamble
                # (environment, install, discovery: 7-16 s of the H200 runs), and asv's
                # benchmarks load what the checkout built.
                prebuild.start(popen=kids.popen)
            proc = kids.popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            reader = threading.Thread(target=relay, args=(proc.stdout, log, out), daemon=True)
            reader.start()
            status = proc.wait()
    finally:
        stop.set()
        if reader is not None:
            reader.join(timeout=10)  # the output's end: asv and its group are gone by now
        end = "interrupted" if status is None else f"asv exited {status}"
        log.close(end)
        out.close(status)
        print(f"asv's complete output: {shown(log.path)}", file=sys.stderr, flush=True)
    if not args.no_publish:
        status = publish.publish(local=local) or status
    return status
