# Sourced by bench.sh and test.sh. Picks the interpreter PY that has the project's
# dependencies: $PYTHON if set, else python3 if it already has them (a GPU box with its own
# torch, asv added from wheels), else a .venv made from requirements.txt and
# requirements-test.txt.
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif python3 -c "import torch, asv, asv_runner, pytest, matplotlib, ninja" >/dev/null 2>&1; then
  PY=$(command -v python3)
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-test.txt
  PY=$PWD/.venv/bin/python
fi
PY=$(command -v "$PY")  # absolute: asv runs it from other directories
# asv's reuse environments layer each commit's build over this interpreter's packages.
export VERIFY_ATTN_BASE_PYTHON=${VERIFY_ATTN_BASE_PYTHON:-$PY}

