"""Registers, static shared memory, spills and occupancy of every CUDA kernel, from nvcc (no GPU).

Compiled with the build's own flags and sources (verify_attn.build.spec) for each
architecture of verify_attn.resources.ARCHS. Dynamic shared memory (all of tc's) is sized at
launch by the plan, so nvcc cannot report it: `measure` prints the plan's, and the suite
records it (track_plan_smem_bytes). Occupancy here counts threads, registers and static shared
memory only, an upper bound where a kernel takes dynamic shared memory.
"""

from __future__ import annotations

import json

from verify_attn import resources

from .cli import Refusal, parser


def main(argv=None) -> int:
    p = parser("resources", __doc__)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    try:
        rep = resources.report()
    except RuntimeError as exc:
        raise Refusal(str(exc)) from None
    if args.json:
        print(json.dumps(rep, indent=1))
        return 0
    print("static smem only (dynamic: the launch plan's, `measure`); occupancy without dynamic smem")
    for arch, files in rep.items():
        for source, kernels in files.items():
            for name, k in kernels.items():
                print(f"{arch:7s} {source:10s} {name:22s} regs={k['registers']:3d} static_smem={k['smem']:6d} "
                      f"stack={k['stack']} spills={k['spill_stores']}/{k['spill_loads']} threads={k['threads']} "
                      f"blocks/SM={k['blocks_per_sm']} occupancy={k['occupancy']:.0%}")
    return 0
