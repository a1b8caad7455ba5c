"""The ceilings that fractions of peak were computed against, kept with the results so
that old results keep their meaning: a known GPU's table figures, else the figures measured
once on this machine and reused (verify_attn.machine.peaks)."""



class _Facts:
    """One set-up for both classes (asv keys setup_cache by its defining line): it imports
    verify_attn.machine and torch, once (about 5 s); asv forks every benchmark from a server
    that imported this module, which must not hold torch (verify_attn/gpu.py says why)."""

    def setup_cache(self):
        from verify_attn import machine, suite

        device = suite.device()
        return {"peaks": machine.peaks(device).__dict__, "gpu": machine.gpu_details() if device == "cuda" else {}}


class Machine(_Facts):
    version = "1"

    def setup(self, facts):
        self.peaks = facts["peaks"]

    def track_peak_tflops(self, facts):
        return self.peaks["flops"] / 1e12

    track_peak_tflops.unit = "TFLOP/s"

    def track_peak_fp32_tflops(self, facts):
        return self.peaks["fp32_flops"] / 1e12

    track_peak_fp32_tflops.unit = "TFLOP/s"

    def track_peak_gbps(self, facts):
        return self.peaks["bytes_per_s"] / 1e9

    track_peak_gbps.unit = "GB/s"


class Gpu(_Facts):
    """The GPU's software and clocks at the time of the run (verify_attn.machine.gpu_details):
    a step in every kernel's times beside a step here is the machine, not the code."""

    version = "1"

    def setup(self, facts):
        self.details = facts["gpu"]
        if not self.details:
            raise NotImplementedError("no GPU seen through NVML")

    def track_driver_version(self, facts):
        return self.details["driver"]

    def track_cuda_version(self, facts):
        return self.details["cuda"]

    def track_sm_count(self, facts):
        return self.details["sms"]

    def track_max_sm_clock(self, facts):
        return self.details["max_sm_clock_mhz"]

    def track_max_mem_clock(self, facts):
        return self.details["max_mem_clock_mhz"]

    def track_app_sm_clock(self, facts):
        return self.details["app_sm_clock_mhz"]

    def track_power_limit(self, facts):
        return self.details["power_limit_w"]

    track_driver_version.unit = "version"
    track_cuda_version.unit = "version"
    track_sm_count.unit = "SMs"
    track_max_sm_clock.unit = track_max_mem_clock.unit = track_app_sm_clock.unit = "MHz"
    track_power_limit.unit = "W"
