"""attnlib.timing: timed and best_time against a fake clock (no real time is asserted), bad repeats, and
peak_memory of an allocation of known size."""

import itertools

import pytest
import torch

from attnlib import timing


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter as seen by attnlib.timing: 0, 10, 20, ... seconds, one step per reading."""
    ticks = itertools.count(0.0, 10.0)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))


def test_timed_returns_the_result_and_the_seconds_of_one_call(clock):
    calls = []
    result, seconds = timed_once = timing.timed(lambda: calls.append(1) or "out")
    assert (result, seconds) == ("out", 10.0) and calls == [1]
    assert isinstance(timed_once, tuple)


def test_best_time_is_the_fastest_of_its_calls(monkeypatch):
    readings = iter([0.0, 5.0, 5.0, 7.0, 7.0, 11.0])  # calls of 5, 2 and 4 seconds
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(readings))
    assert timing.best_time(lambda: None, repeats=3) == 2.0


@pytest.mark.parametrize("repeats", [0, -1])
def test_best_time_rejects_a_repeat_count_below_one(repeats):
    with pytest.raises(ValueError, match=rf"repeats must be >= 1 \(calls to time\), got {repeats}"):
        timing.best_time(lambda: None, repeats=repeats)


@pytest.mark.parametrize("repeats, kind", [(1.5, "float"), (True, "bool")])
def test_best_time_rejects_a_repeat_count_that_is_not_an_int(repeats, kind):
    with pytest.raises(TypeError, match=rf"repeats must be an int \(calls to time\), got {kind}"):
        timing.best_time(lambda: None, repeats=repeats)


def test_peak_memory_counts_what_the_call_holds_at_its_peak():
    n = 1 << 20  # ones (4 MiB) and ones * 2 (4 MiB) live together, then are freed; the 1 MiB result is kept
    peak = timing.peak_memory(lambda: (torch.ones(n) * 2).sum().expand(n // 4).clone())
    assert 8 * n <= peak < 8 * n + 1024, peak

