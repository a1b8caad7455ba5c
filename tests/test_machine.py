"""What the results record of the GPU besides the timings: the driver, CUDA, SMs, clocks,
power limit (NVML), as numbers asv keeps per commit."""

import sys
import types

import pytest

from verify_attn import machine


def _fake_nvml(driver: str):
    m = types.SimpleNamespace(NVML_CLOCK_SM=0, NVML_CLOCK_MEM=2, shut=[])
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: m.shut.append(1)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlDeviceGetMaxClockInfo = lambda h, which: {0: 1980, 2: 3201}[which]
    m.nvmlDeviceGetApplicationsClock = lambda h, which: 1755
    m.nvmlDeviceGetPowerManagementLimit = lambda h: 700000
    return m


def test_gpu_details_are_numbers(monkeypatch):
    nvml = _fake_nvml("580.95.05")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(machine.torch.version, "cuda", "13.0")
    monkeypatch.setattr(machine.torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(multi_processor_count=132))
    got = machine.gpu_details()
    assert got == {"driver": 580.95, "cuda": 13.0, "sms": 132.0, "max_sm_clock_mhz": 1980.0,
                   "max_mem_clock_mhz": 3201.0, "app_sm_clock_mhz": 1755.0, "power_limit_w": 700.0}
    assert nvml.shut == [1]


def test_no_nvml_no_details(monkeypatch):
    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("no driver")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert machine.gpu_details() == {}


def test_the_gpu_benchmarks_skip_without_a_gpu(monkeypatch):
    sys.path.insert(0, str(machine.__file__).rsplit("/verify_attn/", 1)[0] + "/benchmarks")
    try:
        import bench_machine
    finally:
        sys.path.pop(0)
    monkeypatch.setenv("VERIFY_ATTN_DEVICE", "cpu")
    facts = bench_machine.Gpu().setup_cache()  # one set-up for both classes: plain data
    assert facts["gpu"] == {} and facts["peaks"]["flops"] > 0 and facts["peaks"]["bytes_per_s"] > 0
    with pytest.raises(NotImplementedError, match="no GPU"):
        bench_machine.Gpu().setup(facts)
    machine_ = bench_machine.Machine()
    machine_.setup(facts)
    assert machine_.track_peak_gbps(facts) == facts["peaks"]["bytes_per_s"] / 1e9
    assert bench_machine.Gpu.setup_cache is bench_machine.Machine.setup_cache  # asv shares it
