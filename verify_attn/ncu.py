"""Nsight Compute's command line (ncu): find it, ask which metrics the device has, profile a
command into a report, and read the report's raw page back as numbers.

The formats, from Nsight Compute's CLI documentation (2023-2025 releases):

* ``--query-metrics`` lists one metric base name a line (``--csv``: the first field), base name
  meaning the part before the first dot (``dram__bytes`` of ``dram__bytes.sum``). Launch
  attributes (``launch__*``) and device attributes (``device__*``) are not counters and are
  collected with every profiled launch, listed or not.
* ``--import REPORT --csv --page raw`` prints one header row of column names (``"ID"``,
  ``"Process ID"``, ... ``"Kernel Name"``, ..., then one column per metric by name), one row
  of units (empty under the launch columns) and one row per profiled kernel launch. Lines
  of ncu's own (``==PROF==``, ``==WARNING==``) may come before or after. ``--print-units
  base`` prints every metric in its base unit (times in nsecond or second, sizes in byte);
  ``--print-fp`` every number as a float; without it integers carry thousands separators
  ("10,240,000"), which are removed here. A metric without a value reads "n/a" or "".
* ``--print-nvtx-rename kernel`` prints each kernel under the name of its innermost NVTX
  push/pop range instead: the same rows, the same IDs.
"""

from __future__ import annotations

import csv
import glob
import math
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

LAUNCH_COLUMNS = ("ID", "Kernel Name")
ALWAYS = ("launch__", "device__")  # collected with every launch, not in --query-metrics' list


class NcuError(RuntimeError):
    """ncu is absent, refused or failed; the message is one line, ncu's whole output in log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def find() -> str:
    """ncu's path: on PATH, else under $CUDA_HOME or the usual install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for pattern in (f"{home}/bin/ncu", "/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                    "/usr/local/cuda*/nsight-compute*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    raise NcuError("ncu (Nsight Compute) not found: put it on PATH or set CUDA_HOME")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run args in a process group of its own, killed whole on the timeout (ncu's target
    process is its child and would outlive ncu alone)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise NcuError(f"{Path(args[0]).name} {args[1]} did not finish within {timeout:.0f} s") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def version(ncu: str) -> str:
    """ncu's version line ("Version 2025.3.0.0 (build ...)"), or ""."""
    try:
        out = _run([ncu, "--version"], 60).stdout
    except (OSError, NcuError):
        return ""
    return next((line.strip() for line in out.splitlines() if "ersion" in line), out.strip()[:80])


METRIC_NAME = re.compile(r"[a-z][a-z0-9]*__[A-Za-z0-9_]+(?:\.[A-Za-z0-9_.]+)?")


def parse_query(text: str) -> set[str]:
    """The metric base names in --query-metrics' output (text or --csv)."""
    names = set()
    for line in text.splitlines():
        first = next(csv.reader([line.strip()]), [""])[0].strip() if line.strip() else ""
        first = first.split()[0] if first.split() else ""
        if METRIC_NAME.fullmatch(first):
            names.add(first.split(".")[0])
    return names


def query_metrics(ncu: str, chip: str | None = None) -> set[str] | None:
    """The base names of the metrics ncu offers on this machine's device (or on chip, e.g.
    gh100); None when it cannot tell (then every candidate is asked for and ncu's refusal
    names the unknown ones)."""
    for csv_flag in (["--csv"], []):  # the table form where --csv is not taken with the query
        try:
            proc = _run([ncu, "--query-metrics", *csv_flag] + (["--chips", chip] if chip else []), 120)
        except (OSError, NcuError):
            return None
        names = parse_query(proc.stdout)
        if proc.returncode == 0 and names:
            return names
    return None


def offered(name: str, known: set[str] | None) -> bool:
    """Whether ncu offers this full metric name, by the query's base names (None: unknown, yes)."""
    return known is None or name.startswith(ALWAYS) or name.split(".")[0] in known


def refused(log: str, requested) -> list[str]:
    """The requested metrics that ncu's error lines name (an unknown metric stops a profile)."""
    errors = "\n".join(line for line in log.splitlines() if "ERROR" in line)
    return [m for m in requested if re.search(rf"(?<![\w.]){re.escape(m.split('.')[0])}(?![\w])", errors)]


def profile(ncu: str, report: Path, metrics: list[str], nvtx_include: str, command: list[str],
            timeout: float, sections: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> str:
    """Profile command's kernels inside the NVTX push/pop range nvtx_include (ncu's own clock
    control, caches flushed before each replay pass) into report (.ncu-rep), collecting the
    metrics and the sections named (and ncu's further options); returns ncu's output. Raises
    NcuError with its first error line."""
    asked = (["--metrics", ",".join(metrics)] if metrics else []) + [a for s in sections for a in ("--section", s)]
    args = [ncu, "--target-processes", "application-only", "--nvtx", "--nvtx-include", nvtx_include,
            "--cache-control", "all", *asked, *options, "--export", str(report), "--force-overwrite", *command]
    proc = _run(args, timeout)
    if proc.returncode != 0 or not report.with_suffix(".ncu-rep").exists():
        raise NcuError(f"ncu exited {proc.returncode}: {first_error(proc.stdout)}", proc.stdout)
    return proc.stdout


def first_error(log: str) -> str:
    """The line that says why: ncu's first error, else the target's last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if "==ERROR==" in line), lines[-1] if lines else "no output")[:300]


def export_raw(ncu: str, report: Path, nvtx_rename: bool = False) -> str:
    """The report's raw page as CSV in base units (nvtx_rename: each kernel named by its innermost
    NVTX push/pop range)."""
    args = [ncu, "--import", str(report.with_suffix(".ncu-rep")), "--csv", "--page", "raw", "--print-units", "base",
            "--print-fp"] + (["--print-nvtx-rename", "kernel"] if nvtx_rename else [])
    proc = _run(args, 120)
    if proc.returncode != 0:
        raise NcuError(f"ncu --import exited {proc.returncode}: {first_error(proc.stdout)}")
    return proc.stdout


def export_source(ncu: str, report: Path, launch: int) -> str:
    """One launch's source page as CSV: every source line its code came from and under each its
    SASS instructions with their counters (verify_attn.stalls reads it). launch is the raw
    page's ID, the launch's place in the report."""
    args = [ncu, "--import", str(report.with_suffix(".ncu-rep")), "--launch-skip", str(launch), "--launch-count", "1",
            "--page", "source", "--print-source", "cuda,sass", "--csv"]
    proc = _run(args, 120)
    if proc.returncode != 0:
        raise NcuError(f"ncu --import --page source exited {proc.returncode}: {first_error(proc.stdout)}")
    return proc.stdout


def passes(log: str) -> list[int]:
    """The replay passes per profiled launch (ncu: '==PROF== Profiling "k" - 0: ... - 9 passes')."""
    return [int(n) for n in re.findall(r"==PROF== Profiling .*?(\d+) pass", log)]


_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30}
_TIME = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def unit_scale(unit: str) -> float:
    """The factor to SI base units (seconds, bytes, bytes/second) of a unit ncu prints;
    1 for the rest (%, registers, ratios)."""
    num, _, den = unit.strip().partition("/")
    scale = _TIME.get(num, 1.0)
    size = re.fullmatch(r"([KMGT]i?)?(?:byte|B)", num)
    if size:
        scale = _PREFIX[size[1] or ""]
    return scale / _TIME.get(den, 1.0)


def number(text: str) -> float:
    """A value as ncu prints it: thousands separators dropped; n/a or empty is NaN."""
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_raw(text: str) -> list[dict]:
    """[{"id", "kernel", "values": {metric name: value in SI base units}}] of a --page raw --csv
    export, one per profiled launch in launch order. Raises NcuError when there is no raw page."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    start = next((n for n, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        raise NcuError(f"no raw page in ncu's export: {(text.strip().splitlines() or ['(empty)'])[0][:200]}")
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    if not all(c in header for c in LAUNCH_COLUMNS):
        raise NcuError(f"ncu's raw page lacks the columns {', '.join(LAUNCH_COLUMNS)}")
    col = {name: n for n, name in enumerate(header)}
    has_units = len(rows) > 1 and bool(rows[1]) and not rows[1][0].strip()  # the units row: no ID
    units = rows[1] if has_units else [""] * len(header)
    metrics = [(n, name, unit_scale(units[n]) if n < len(units) else 1.0) for n, name in enumerate(header)
               if "__" in name]
    out = []
    for row in rows[2 if has_units else 1:]:
        if len(row) != len(header) or not row[col["ID"]].strip().isdigit():
            continue
        out.append({"id": int(row[col["ID"]]), "kernel": row[col["Kernel Name"]],
                     "values": {name: number(row[n]) * scale for n, name, scale in metrics}})
    return out
