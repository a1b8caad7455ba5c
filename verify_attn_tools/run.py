"""asv over commits on this machine's default device, then publish the site.

RANGE is any asv range (default HEAD^!: the current commit). Each commit is built in its
own environment over this interpreter's torch (asv_plugins/reuse_env.py) with 15 samples a
point. A machine the repository tracks (it has results/<machine>/) records there and
publishes html/; any other machine records into .asv/local/ and publishes .asv/local/html,
so a newcomer's run leaves the checkout's committed files alone (--track makes this machine
a tracked one). asv runs in a process group of its own: Ctrl-C or SIGTERM ends it with every
benchmark process it started. asv shows a benchmark's output only when it ends, so the suite's own
progress lines are followed meanwhile.
"""

from __future__ import annotations

import sys
import threading
import time

from verify_attn import build, suite
from verify_attn.machine import asv_machine_name

from . import ROOT, publish, tracked
from .children import cleanup
from .cli import Refusal, parser


ASV = [sys.executable, "-m", "asv"]


def register_machine(name: str) -> None:
    """Register this box with asv under NAME, the name alone. asv copies every field of a
    machine entry into each result's parameters and publish draws one series per parameter
    set, so a field that differs between two lent hosts of the same GPU (RAM, CPU count)
    would cut the history in two (tests/test_results.py checks one set per machine).
    ``asv machine --yes`` would keep fields stored earlier, so the entry is replaced."""
    from asv.machine import MachineCollection

    MachineCollection.save(name, {"machine": name})


def follow(path, stop: threading.Event) -> None:
    """Print lines appended to path until stop is set (tail -f)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    with open(path) as f:
        while not stop.is_set():
            line = f.readline()
            if line:
                print(line, end="", file=sys.stderr, flush=True)
            else:
                time.sleep(0.5)


def main(argv=None) -> int:
    p = parser("run", __doc__)
    p.add_argument("range", nargs="*", default=["HEAD^!"], help="asv commit range (default HEAD^!)")
    p.add_argument("--bench", "-b", action="append", help="only benchmarks matching this regex (asv -b)")
    p.add_argument("--no-publish", action="store_true", help="record results only")
    p.add_argument("--track", action="store_true",
                   help="record into results/<machine>/ even though the repository does not track this machine yet")
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
    stop = threading.Event()
    threading.Thread(target=follow, args=(build.cache_dir() / "progress.log", stop), daemon=True).start()
    bench = [a for b in args.bench or [] for a in ("-b", b)]
    try:
        # asv in a process group of its own: an interrupt ends it with its benchmark processes.
        with cleanup() as kids:
            status = kids.popen([*ASV, *config, "run", "--machine", machine, "--record-samples", *bench,
                                 *args.range], cwd=ROOT).wait()
    finally:
        stop.set()
    if not args.no_publish:
        status = publish.publish(local=local) or status
    return status
