"""Registers, shared memory, spills and occupancy of each kernel, from nvcc (no GPU needed)."""

from verify_attn import resources

KERNELS = ["naive_scores", "naive_softmax", "naive_output", "flash_split", "flash_merge"]


class Resources:
    params = [KERNELS, list(resources.ARCHS)]
    param_names = ["kernel", "arch"]
    timeout = 600
    version = "1"

    def setup_cache(self):
        try:
            return resources.report()
        except (RuntimeError, OSError) as exc:  # no nvcc on this machine
            return {"error": str(exc)}

    def setup(self, report, kernel, arch):
        if "error" in report:
            raise NotImplementedError(report["error"])
        self.k = report.get(arch, {}).get(kernel)
        if self.k is None:
            raise NotImplementedError(f"{kernel} does not exist at this commit")

    def track_registers(self, report, kernel, arch):
        return self.k["registers"]

    track_registers.unit = "registers"

    def track_smem_bytes(self, report, kernel, arch):
        return self.k["smem"]

    track_smem_bytes.unit = "bytes"

    def track_spill_bytes(self, report, kernel, arch):
        return self.k["spill_stores"] + self.k["spill_loads"]

    track_spill_bytes.unit = "bytes"

    def track_unused_warp_slots(self, report, kernel, arch):
        """Share of the SM's thread slots the occupancy limit leaves empty (1 - occupancy)."""
        return round(1.0 - self.k["occupancy"], 4)

    track_unused_warp_slots.unit = "fraction"
