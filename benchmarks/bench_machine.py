"""The ceilings that fractions of peak were computed against, kept with the results so
that old results keep their meaning. Recorded for devices with table figures only: measured
ceilings vary run to run and would read as changes."""

from verify_attn import machine, suite


class Machine:
    version = "1"

    def setup(self):
        name = machine.device_name(suite.device())
        if name not in machine.KNOWN:
            raise NotImplementedError("ceilings measured per run on this device, not tracked")
        self.peaks = machine.KNOWN[name]

    def track_peak_tflops(self):
        return self.peaks.flops / 1e12

    track_peak_tflops.unit = "TFLOP/s"

    def track_peak_fp32_tflops(self):
        return self.peaks.fp32_flops / 1e12

    track_peak_fp32_tflops.unit = "TFLOP/s"

    def track_peak_gbps(self):
        return self.peaks.bytes_per_s / 1e9

    track_peak_gbps.unit = "GB/s"
