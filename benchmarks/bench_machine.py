"""The ceilings that fractions of peak were computed against, kept with the results so
that old results keep their meaning: a known GPU's table figures, else the figures measured
once on this machine and reused (verify_attn.machine.peaks)."""

# verify_attn.machine (torch) is imported by setup_cache, once: asv forks every benchmark from
# a server that imported this module (verify_attn/gpu.py says why it must not hold torch).


class Machine:
    version = "1"

    def setup_cache(self):
        from verify_attn import machine, suite

        return machine.peaks(suite.device()).__dict__

    def setup(self, peaks):
        self.peaks = peaks

    def track_peak_tflops(self, peaks):
        return self.peaks["flops"] / 1e12

    track_peak_tflops.unit = "TFLOP/s"

    def track_peak_fp32_tflops(self, peaks):
        return self.peaks["fp32_flops"] / 1e12

    track_peak_fp32_tflops.unit = "TFLOP/s"

    def track_peak_gbps(self, peaks):
        return self.peaks["bytes_per_s"] / 1e9

    track_peak_gbps.unit = "GB/s"


class Gpu:
    """The GPU's software and clocks at the time of the run (verify_attn.machine.gpu_details):
    a step in every kernel's times beside a step here is the machine, not the code."""

    version = "1"

    def setup_cache(self):
        from verify_attn import machine, suite

        return machine.gpu_details() if suite.device() == "cuda" else {}

    def setup(self, details):
        self.details = details
        if not self.details:
            raise NotImplementedError("no GPU seen through NVML")

    def track_driver_version(self, details):
        return self.details["driver"]

    def track_cuda_version(self, details):
        return self.details["cuda"]

    def track_sm_count(self, details):
        return self.details["sms"]

    def track_max_sm_clock(self, details):
        return self.details["max_sm_clock_mhz"]

    def track_max_mem_clock(self, details):
        return self.details["max_mem_clock_mhz"]

    def track_app_sm_clock(self, details):
        return self.details["app_sm_clock_mhz"]

    def track_power_limit(self, details):
        return self.details["power_limit_w"]

    track_driver_version.unit = "version"
    track_cuda_version.unit = "version"
    track_sm_count.unit = "SMs"
    track_max_sm_clock.unit = track_max_mem_clock.unit = track_app_sm_clock.unit = "MHz"
    track_power_limit.unit = "W"
