"""The timer's behaviour (not GPU speed): rotation, samples, side-by-side alternation."""

import time

import pytest
import torch

from verify_attn.timer import Timer


def test_calls_rotate_over_input_sets():
    seen = []
    calls = [lambda k=k: seen.append(k) for k in range(3)]
    Timer("cpu", samples=4, min_sample_s=0.0, warmup_s=0.0).time(calls)
    assert set(seen) == {0, 1, 2}
    timed = seen[6:]  # after calibration (3 warm-up + 3 host-rate calls)
    assert all(b == (a + 1) % 3 for a, b in zip(timed, timed[1:]))


def test_samples_measure_the_call():
    timing = Timer("cpu", samples=5, min_sample_s=0.01, warmup_s=0.0).time([lambda: time.sleep(0.002)])
    assert len(timing.samples) == 5 and timing.number >= 3
    assert 0.002 <= timing.median < 0.010  # a loaded CI machine oversleeps, never undersleeps
    assert timing.asv() == {"samples": timing.samples, "number": timing.number}


def test_one_call_is_timed_to_its_end():
    done = []
    took = Timer("cpu").call_s(lambda: time.sleep(0.003) or done.append(1))
    assert done == [1] and 0.003 <= took < 0.5


def test_a_slow_call_is_warmed_twice_not_over_every_input_set():
    """A call over slow_call_s: two warm-up calls of the first input set, then slow_samples
    samples of one call each; a call that is slow only the first time is calibrated as fast."""
    seen = []
    calls = [lambda k=k: (seen.append(k), time.sleep(0.012)) for k in range(4)]
    timing = Timer("cpu", samples=9, min_sample_s=0.05, warmup_s=0.0, slow_call_s=0.01, slow_samples=3).time(calls)
    assert seen[:2] == [0, 0] and len(seen) == 2 + 3
    assert timing.number == 1 and len(timing.samples) == 3
    seen.clear()
    first = [True]

    def once_slow():
        seen.append(0)
        if first[0]:
            first[0] = False
            time.sleep(0.012)

    timing = Timer("cpu", samples=4, min_sample_s=0.0, warmup_s=0.0, slow_call_s=0.01, slow_samples=2).time([once_slow])
    assert len(timing.samples) == 4  # not the slow count: the second call was fast


def test_a_long_call_gets_its_own_sample_count():
    """Over long_call_s the count is long_samples (more than samples, unlike slow_samples);
    between the two limits slow_samples; under both samples."""
    timer = Timer("cpu", samples=4, min_sample_s=0.0, warmup_s=0.0, slow_call_s=0.01, slow_samples=3,
                  long_call_s=0.1, long_samples=5)
    assert [timer.samples_for(s) for s in (0.001, 0.02, 0.2)] == [4, 3, 5]
    timings = timer.time_many({"long": [lambda: time.sleep(0.15)], "slow": [lambda: time.sleep(0.03)]})
    assert len(timings["long"].samples) == 5 and len(timings["slow"].samples) == 3
    assert Timer("cpu", samples=4, slow_call_s=0.01, slow_samples=3).samples_for(1.0) == 3


def test_tied_variants_take_the_same_number_of_samples():
    """A kernel and its yardstick on either side of a sample-count limit: both take the larger
    count, so their samples pair one to one (paired_ratios zips them)."""
    timer = Timer("cpu", samples=4, min_sample_s=0.0, warmup_s=0.0, slow_call_s=0.02, slow_samples=2)
    calls = {"kernel": [lambda: time.sleep(0.001)], "twin": [lambda: time.sleep(0.05)]}
    apart = timer.time_many(calls)
    assert (len(apart["kernel"].samples), len(apart["twin"].samples)) == (4, 2)
    tied = timer.time_many(calls, ties={"kernel": "twin"})
    assert len(tied["kernel"].samples) == len(tied["twin"].samples) == 4


def test_variants_alternate():
    order = []
    Timer("cpu", samples=3, min_sample_s=0.0, warmup_s=0.0).time_many(
        {"a": [lambda: order.append("a")], "b": [lambda: order.append("b")]})
    timed = order[4:]  # after each variant's calibration (2 calls each)
    assert timed == ["a", "b"] * 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_timer_sees_a_known_sleep():
    cycles = int(2e6)
    timing = Timer("cuda", samples=5).time([lambda: torch.cuda._sleep(cycles)])
    assert timing.sm_clock_mhz is None or timing.sm_clock_mhz > 0
    # 2e6 cycles at 1-2 GHz: 1-2 ms per call
    assert 0.5e-3 < timing.median < 4e-3


def test_unreadable_clock_warns_once_and_is_recorded(monkeypatch):
    """Without NVML the clock screen is off: the timer says so once and the timing records it."""
    from verify_attn import timer as timer_module

    monkeypatch.setattr(timer_module, "_sm_clock", lambda: None)
    monkeypatch.setattr(timer_module, "_warned", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.warns(RuntimeWarning, match="not screened"):
        first = Timer("cuda", samples=1)
    assert not first.screens_clock
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Timer("cuda", samples=1)  # a second timer stays silent


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_timer_screens_clocks_with_nvml():
    timing = Timer("cuda", samples=3).time([lambda: torch.cuda._sleep(100000)])
    assert timing.clock_screened and timing.sm_clock_mhz > 0


def test_reversed_odd_rounds_put_each_neighbour_first_half_the_time():
    order = []
    Timer("cpu", samples=4, min_sample_s=0.0, warmup_s=0.0).time_many(
        {v: [lambda v=v: order.append(v)] for v in "abc"}, reverse_odd_rounds=True)
    assert order[6:] == list("abc" "cba" "abc" "cba")  # after each variant's calibration (2 calls each)
