"""The guard around reader code: the time limit counts the reader's own code (not a library's cold import),
quotes the reader's own line, and whatever the code does to torch, print options, the recursion limit or
the process is undone and named, the notebook's kernel surviving it."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
import torch

from attnlib.exercises import check_sliding_window_mask
from attnlib.exercises._core import CandidateError, run
from attnlib.exercises._guard import limited_to


def _window(T, window):
    i = torch.arange(T)
    return (i[:, None] >= i) & (i[:, None] - i < window)


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """A module whose first import takes 1.5 s (a cold `import transformers` on a busy machine)."""
    name = f"_slow_import_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.5)\nVALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_cold_import_inside_the_answer_does_not_count_against_the_limit(slow_module):
    def answer(x):
        module = __import__(slow_module)
        return x * module.VALUE
    with limited_to(0.5):
        assert torch.equal(run(answer, torch.ones(2)), torch.full((2,), 2.0))


def test_a_lazy_import_through_import_module_does_not_count_either(slow_module):
    import importlib

    def answer(x):                     # transformers' lazy modules import this way on attribute access
        return x * importlib.import_module(slow_module).VALUE
    with limited_to(0.5):
        assert torch.equal(run(answer, torch.ones(2)), torch.full((2,), 2.0))


def test_the_reader_code_after_a_cold_import_is_still_limited_and_its_line_quoted(slow_module):
    def answer(x):
        __import__(slow_module)
        while True:
            x = x + 1
    with limited_to(0.5), pytest.raises(CandidateError) as info:
        run(answer, torch.ones(2), what="answer(x)")
    message = str(info.value)
    assert "did not return within 0.5 s" in message and "`x = x + 1`" in message or "`while True:`" in message
    assert "line 0" not in message and "frozen" not in message, message


def test_importing_a_loaded_module_in_a_loop_is_the_readers_time():
    def answer(x):
        while True:
            import os  # noqa: F401
    with limited_to(0.3), pytest.raises(CandidateError, match="did not return within 0.3 s"):
        run(answer, torch.ones(2))


def test_torch_functions_replaced_before_the_check_are_named_and_put_back():
    equal, allclose = torch.equal, torch.allclose
    try:
        torch.equal = torch.allclose = lambda *a, **k: True
        result = check_sliding_window_mask(lambda T, window: torch.zeros(T, T, dtype=torch.bool))
    finally:
        restored = torch.equal is equal and torch.allclose is allclose
        torch.equal, torch.allclose = equal, allclose
    assert restored and not result.passed, result
    assert "replaced torch's own torch.allclose, torch.equal" in result.message


@pytest.mark.parametrize("patch, name", [
    ("torch.equal = torch.allclose = lambda *a, **k: True", "torch.allclose, torch.equal"),
    ("torch.Tensor.__eq__ = lambda a, b: torch.ones((), dtype=torch.bool)", "torch.Tensor.__eq__"),
    ("torch.Tensor.equal = lambda a, b: True", "torch.Tensor.equal"),
    ("del torch.nn.functional.softmax", "torch.nn.functional.softmax")])
def test_torch_functions_replaced_inside_the_answer_are_named_and_put_back(patch, name):
    before = {k: getattr(torch, k) for k in ("equal", "allclose")}
    eq, softmax = torch.Tensor.__eq__, torch.nn.functional.softmax
    scope = {"torch": torch, "_window": _window}
    exec(textwrap.dedent(f"""
        def answer(T, window):
            {patch}
            return _window(T, window)
        """), scope)
    result = check_sliding_window_mask(scope["answer"])
    assert not result.passed and f"replaced torch's own {name}" in result.message, result.message
    assert {k: getattr(torch, k) for k in before} == before and torch.Tensor.__eq__ is eq
    assert "equal" not in vars(torch.Tensor) and torch.nn.functional.softmax is softmax


def test_a_function_a_library_wraps_on_import_is_not_the_readers():
    import torch._dynamo  # noqa: F401 - wraps torch.manual_seed when first imported
    assert check_sliding_window_mask(_window).passed


@pytest.mark.parametrize("change, words", [
    ("torch.set_printoptions(precision=2)", "called torch.set_printoptions(precision=2) and left it set"),
    ("sys.setrecursionlimit(12345)", "called sys.setrecursionlimit(12345) and left it set")])
def test_print_options_and_the_recursion_limit_are_put_back(change, words):
    limit, precision = sys.getrecursionlimit(), torch.tensor([1 / 3]).__repr__()
    scope = {"torch": torch, "sys": sys, "_window": _window}
    exec(f"def answer(T, window):\n    {change}\n    return _window(T, window)\n", scope)
    result = check_sliding_window_mask(scope["answer"])
    assert not result.passed and words in result.message, result.message
    assert sys.getrecursionlimit() == limit and repr(torch.tensor([1 / 3])) == precision


@pytest.mark.parametrize("call", ["os._exit(0)", "os.abort()", "os.kill(os.getpid(), 9)", "os.kill(0, 15)",
                                  "signal.raise_signal(9)"])
def test_an_answer_that_ends_the_process_is_stopped_and_named(call):
    import os
    import signal
    scope = {"os": os, "signal": signal}
    exec(f"def answer(T, window):\n    {call}\n", scope)
    result = check_sliding_window_mask(scope["answer"])  # this test process survives
    shown = re.escape(call).replace(r"os\.getpid\(\)", r"\d+")  # the pid of the process the check ran in
    assert not result.passed and re.search(f"called {shown}", result.message) and "ends the whole process" in \
        result.message, result.message
    assert all(f.__module__ in ("posix", "_signal") for f in (os._exit, os.abort, os.kill, signal.raise_signal))


def test_a_new_tensor_method_of_the_readers_own_name_is_left_alone():
    torch.Tensor.my_window = lambda self: self
    try:
        assert check_sliding_window_mask(_window).passed and torch.Tensor.my_window
    finally:
        del torch.Tensor.my_window


def test_set_default_dtype_is_named_as_itself_not_as_a_replaced_torch_storage():
    def answer(x):
        torch.set_default_dtype(torch.float64)
        return x
    with pytest.raises(CandidateError) as info:
        run(answer, torch.ones(2), what="answer(x)")
    message = str(info.value)
    assert "torch.set_default_dtype(torch.float64)" in message and "Storage" not in message, message
    assert torch.get_default_dtype() == torch.float32 and torch.Storage is torch.FloatStorage


def test_a_replaced_attnlib_reference_is_put_back_and_named():
    import attnlib
    original = attnlib.softmax

    def answer(T, window):
        attnlib.softmax = lambda t, dim=-1: torch.zeros_like(t)
        return _window(T, window)
    result = check_sliding_window_mask(answer)
    assert not result.passed and "attnlib.softmax" in result.message, result.message
    assert attnlib.softmax is original
