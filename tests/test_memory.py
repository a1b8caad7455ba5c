"""Memory bounded by the work: a call's scratch memory scales with the rows it uses, not
with the columns of the index table (kv_cols): within 64 MiB for a 4,194,304-column table
with 19 rows used, and within 256 MiB (split partials) for heads 128, q_len 65, prefix 65,536.

CPU (in CI): the peak resident memory of one raw op call in a fresh subprocess, from
/proc/self/status (the peak is reset first through /proc/self/clear_refs; where that is not
allowed the peak since start is used, which can only over-count). CUDA (where torch sees a
GPU): torch.cuda.max_memory_allocated around the call, beyond its inputs and outputs.

The raw op is measured, not verify_attention: its value check (ops.check_values) builds
masks of kv_cols elements, a cost of the Python entry point and not of a kernel.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import COMPILED, require
from verify_attn import cases, registry

LIMIT = 64 << 20
# A huge index table with a short prefix: 4,194,304 columns of which 19 are used.
WIDE = cases.Case("wide_4194304", 1, 16, 9, (10,), paged=True, pad_to=4194304, large=True)
# A long prefix with many rows (batch x heads x q_len = 8,320), contiguous.
LONG = cases.Case("h128_q65_p65536", 1, 128, 65, (65536,), large=True)
CPU_IMPLS = [n for n in COMPILED if registry.IMPLS[n].cpu_sources]
# Per case: the 4M-column table must cost no more than a small case; the long case may hold
# split partials (flash: splits x rows x 513 floats, about 179 MiB at 11 splits on an H200),
# but nothing that grows with batch x heads x q_len x kv_cols (naive's old 2.2 GB).
CUDA_LIMIT = {"wide_4194304": LIMIT, "h128_q65_p65536": 256 << 20}

ROOT = Path(__file__).resolve().parent.parent
PROBE = r"""
import json, sys
import torch
from verify_attn import cases, ops

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

impl, fields = sys.argv[1], json.loads(sys.argv[2])
ops.load()
op = getattr(torch.ops.verify_attn, impl)

def args(case):
    i = cases.make_inputs(case)
    batch, q_len, heads, _ = i.q.shape
    out = torch.empty((batch, q_len, heads, 512), dtype=torch.bfloat16)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32)
    return (i.q, i.kv, i.kv_indices, i.parent, i.prefix_lens, i.scale, out, lse)

op(*args(cases.CASES["paged_2x16x17"]))  # warm up: threads, allocator, lazy initialisation
call = args(cases.Case(**fields))
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set size to the current one
    exact = True
except OSError:
    exact = False
before = status("VmRSS")
op(*call)
print(json.dumps({"extra": status("VmHWM") - before, "exact": exact}))
"""


def cpu_extra(impl: str, case: cases.Case) -> dict:
    fields = {f: getattr(case, f) for f in ("name", "batch", "heads", "q_len", "prefix_lens", "tree", "paged",
                                             "pad_to")}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", PROBE, impl, json.dumps(fields)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status (Linux)")
@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_cpu_memory_of_a_huge_index_table(impl):
    result = cpu_extra(impl, WIDE)
    mib = result["extra"] / 2**20
    print(f"{impl}: +{mib:.1f} MiB peak resident ({'exact' if result['exact'] else 'upper bound'})")
    assert result["extra"] <= LIMIT, f"{impl} used {mib:.1f} MiB beyond its inputs for 19 of 4,194,304 columns"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA memory needs a GPU")
@pytest.mark.parametrize("case", [WIDE, LONG], ids=lambda c: c.name)
@pytest.mark.parametrize("impl", COMPILED)
def test_cuda_memory(impl, case):
    i = cases.make_inputs(case, "cuda", 0)
    require(impl, "cuda", i)
    batch, q_len, heads, _ = i.q.shape
    out = torch.empty((batch, q_len, heads, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device="cuda")
    op = getattr(torch.ops.verify_attn, impl)
    args = (i.q, i.kv, i.kv_indices, i.parent, i.prefix_lens, i.scale, out, lse)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    op(*args)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"{impl} {case.name}: +{extra / 2**20:.1f} MiB")
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
    assert extra <= CUDA_LIMIT[case.name], f"{impl} used {extra / 2**20:.1f} MiB of GPU memory beyond inputs and outputs"
