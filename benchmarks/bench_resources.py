"""Registers, shared memory, spills and occupancy of each implementation's CUDA kernels,
from nvcc's own report with the build's flags (no GPU needed)."""

from verify_attn import prebuild, registry, resources


class Resources:
    # A pinned-path variant compiles the same sources as its kernel: one row for both.
    params = [[n for n in registry.display_order("cuda") if registry.get(n).cuda_sources and not registry.get(n).variant_of],
              list(resources.ARCHS)]
    param_names = ["impl", "arch"]
    timeout = 600
    version = "2"  # per implementation (version 1 was per kernel function)

    def setup_cache(self):
        # The suite's builds start here, beside this nvcc report (or already in Profile's set-up,
        # which asv runs first where it is selected).
        prebuild.start()
        try:
            return resources.report()
        except (RuntimeError, OSError) as exc:  # no nvcc on this machine
            return {"error": str(exc)}

    def setup(self, report, impl, arch):
        if "error" in report:
            raise NotImplementedError(report["error"])
        self.kernels = resources.of_impl(report, impl, arch)
        if not self.kernels:
            raise NotImplementedError(f"{impl} has no kernels at this commit")

    def track_registers(self, report, impl, arch):
        """Most registers a thread of any of the implementation's kernels."""
        return max(k["registers"] for k in self.kernels.values())

    track_registers.unit = "registers"

    def track_smem_bytes(self, report, impl, arch):
        """Most static shared memory a block of any of its kernels."""
        return max(k["smem"] for k in self.kernels.values())

    track_smem_bytes.unit = "bytes"

    def track_spill_bytes(self, report, impl, arch):
        """Spill stores + loads over all of its kernels: anything but 0 is a defect."""
        return sum(k["spill_stores"] + k["spill_loads"] for k in self.kernels.values())

    track_spill_bytes.unit = "bytes"

    def track_unused_warp_slots(self, report, impl, arch):
        """Share of the SM's thread slots its least occupied kernel leaves empty (1 - occupancy)."""
        return round(1.0 - min(k["occupancy"] for k in self.kernels.values()), 4)

    track_unused_warp_slots.unit = "fraction"
