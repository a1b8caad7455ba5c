"""The ceilings that fractions of peak were computed against, kept with the results so
that old results keep their meaning: a known GPU's table figures, else the figures measured
once on this machine and reused (verify_attn.machine.peaks)."""

from verify_attn import machine, suite


class Machine:
    version = "1"

    def setup(self):
        self.peaks = machine.peaks(suite.device())

    def track_peak_tflops(self):
        return self.peaks.flops / 1e12

    track_peak_tflops.unit = "TFLOP/s"

    def track_peak_fp32_tflops(self):
        return self.peaks.fp32_flops / 1e12

    track_peak_fp32_tflops.unit = "TFLOP/s"

    def track_peak_gbps(self):
        return self.peaks.bytes_per_s / 1e9

    track_peak_gbps.unit = "GB/s"
