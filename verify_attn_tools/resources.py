"""Registers, shared memory, spills and occupancy of every CUDA kernel, from nvcc (no GPU).

Compiled with the build's own flags and sources (verify_attn.build.spec) for each
architecture of verify_attn.resources.ARCHS.
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
    for arch, files in rep.items():
        for source, kernels in files.items():
            for name, k in kernels.items():
                print(f"{arch:7s} {source:10s} {name:22s} regs={k['registers']:3d} smem={k['smem']:6d} "
                      f"stack={k['stack']} spills={k['spill_stores']}/{k['spill_loads']} threads={k['threads']} "
                      f"blocks/SM={k['blocks_per_sm']} occupancy={k['occupancy']:.0%}")
    return 0
