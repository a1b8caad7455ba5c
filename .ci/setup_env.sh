# Sourced by bench.sh and test.sh. Picks the interpreter PY that has the project's
# dependencies: $PYTHON if set, else python3 if it already has them (a GPU box with its own
# torch, asv added from wheels), else a .venv made from requirements.txt.
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif python3 -c "import torch, asv, asv_runner, pytest, matplotlib, ninja" >/dev/null 2>&1; then
  PY=$(command -v python3)
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  PY=$PWD/.venv/bin/python
fi
PY=$(command -v "$PY")  # absolute: asv runs it from other directories
# asv's reuse environments layer each commit's build over this interpreter's packages.
export VERIFY_ATTN_BASE_PYTHON=${VERIFY_ATTN_BASE_PYTHON:-$PY}

# Register this machine with asv under NAME. asv keeps only the fields that differ from
# its own detection, so the GPU is added to the CPU's description to be recorded at all.
asv_machine() {
  local gpu cpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  cpu=$(grep -m 1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)
  "$PY" -m asv machine --yes --machine "$1" --os "$(uname -sr)" --arch "$(uname -m)" \
    --cpu "${cpu:-unknown}${gpu:+, $gpu}" --num_cpu "$(nproc)" \
    --ram "$(awk '/MemTotal/ {print $2}' /proc/meminfo 2>/dev/null)" >/dev/null
}
