"""The asv machine name of this box (the GPU's name, or cpu-<arch>) and the ceilings used."""

from __future__ import annotations

import torch

from verify_attn.machine import asv_machine_name, peaks

from .cli import parser


def main(argv=None) -> int:
    p = parser("machine", __doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--peaks", action="store_true", help="also print the ceilings fractions of peak use")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        from .cli import need_gpu

        need_gpu("--device cuda")
    print(asv_machine_name(args.device))
    if args.peaks:
        pk = peaks(args.device)
        print(f"{pk.device}: {pk.flops / 1e12:.1f} TFLOP/s matrix, {pk.fp32_flops / 1e12:.1f} TFLOP/s fp32, "
              f"{pk.bytes_per_s / 1e9:.0f} GB/s ({pk.source})")
    return 0
