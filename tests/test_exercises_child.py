"""Every exercise check runs in a forked child process (on Linux): an answer that crashes in C code, stops its
process, or hangs where the time limit's exception cannot reach it costs the child, never the caller; what
the answer prints still reaches the reader; ATTNLIB_CHECK_IN_PROCESS=1 runs the check in the caller."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from attnlib.exercises import check_stable_softmax
from attnlib.exercises._child import ChildLost, in_child
from attnlib.exercises._guard import limited_to

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks fork on Linux only")


def test_an_answer_that_crashes_in_c_code_fails_the_check_and_the_caller_survives():
    def softmax(x, dim=-1):
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    result = check_stable_softmax(softmax)
    assert not result.passed and "killed by signal 11 (SIGSEGV" in result.message, result.message


def test_an_answer_that_stops_its_own_process_is_killed_after_the_deadline():
    def softmax(x, dim=-1):
        import signal
        import threading
        signal.pthread_kill(threading.main_thread().ident, signal.SIGSTOP)
        return torch.softmax(x, dim)
    with limited_to(0.5):
        result = check_stable_softmax(softmax)
    assert not result.passed and "did not finish within 7 s and was stopped" in result.message, result.message


def test_what_the_answer_prints_reaches_the_reader(capsys):
    def softmax(x, dim=-1):
        print("shape", tuple(x.shape))
        z = (x - x.amax(dim, keepdim=True).clamp_min(-1e30)).exp()
        return torch.nan_to_num(z / z.sum(dim, keepdim=True))
    check_stable_softmax(softmax)
    assert "shape (2, 3, 5)" in capsys.readouterr().out


def test_a_change_of_global_state_is_named_from_the_child_and_the_caller_never_sees_it():
    def softmax(x, dim=-1):
        torch.set_default_dtype(torch.float64)
        return torch.softmax(x, dim)
    result = check_stable_softmax(softmax)
    assert "torch.set_default_dtype(torch.float64)" in result.message and torch.get_default_dtype() == torch.float32


def test_in_process_on_request(monkeypatch):
    calls = []

    def softmax(x, dim=-1):
        calls.append(os.getpid())
        return torch.softmax(x, dim)
    monkeypatch.setenv("ATTNLIB_CHECK_IN_PROCESS", "1")
    check_stable_softmax(softmax)
    assert calls and set(calls) == {os.getpid()}


def test_in_child_returns_raises_and_reports_an_exit():
    assert in_child(lambda: 6 * 7, 5.0) == 42
    with pytest.raises(KeyError):
        in_child(lambda: {}["missing"], 5.0)
    with pytest.raises(ChildLost, match="exited with status 3"):
        in_child(lambda: os._exit(3), 5.0)


def test_a_keyboard_interrupt_in_the_answer_still_interrupts_the_caller():
    def softmax(x, dim=-1):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        check_stable_softmax(softmax)
