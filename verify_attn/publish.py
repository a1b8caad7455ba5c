"""Publish the history: asv publish into html/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    return subprocess.call([sys.executable, "-m", "asv", "publish"], cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
