"""Reader code runs under a time limit and leaves torch's global state as it found it (exercises._guard):
in this process (a notebook cell), on the main thread and on another one, with nothing left running."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch
from torch import nn

from attnlib.exercises import check_multi_head_attention, check_shift_right
from attnlib.exercises._core import CandidateError, run
from attnlib.exercises._guard import limited_to


class Good(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.h, -1)).permute(2, 0, 3, 1, 4)
        return self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
                        .flatten(2))


def _looping(self, x, mask=None):
    while True:
        pass


def _sleeping(self, x, mask=None):
    time.sleep(60)


def _exiting(self, x, mask=None):
    raise SystemExit(0)


@pytest.mark.parametrize("forward, words", [
    (_looping, ["forward(x) did not return within 0.3 s and was stopped", "`while True:`"]),
    (_sleeping, ["did not return within 0.3 s", "`time.sleep(60)`"]),
    (_exiting, ["forward(x) called sys.exit(0)", "`raise SystemExit(0)`"])])
def test_a_hang_or_an_exit_in_forward_is_named(forward, words):
    handler, threads = signal.getsignal(signal.SIGALRM), threading.active_count()  # pytest-xdist runs one of its own
    start = time.monotonic()
    result = check_multi_head_attention(type("Bad", (Good,), {"forward": forward}), seconds=0.3)
    assert not result.passed and time.monotonic() - start < 10, result.message
    for w in words:
        assert w in result.message, (w, result.message)
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert threading.active_count() == threads  # no timer thread left behind


def test_every_checker_has_the_limit_even_off_the_main_thread():
    def loop(tgt, bos):
        while True:
            pass
    found, threads = [], threading.active_count()

    def worker():
        with limited_to(0.3):
            found.append(check_shift_right(loop))
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive() and "did not return within 0.3 s" in found[0].message, found
    assert threading.active_count() == threads


@pytest.mark.parametrize("change, words", [
    (lambda: torch.set_default_dtype(torch.float64), "called torch.set_default_dtype(torch.float64) and left it set"),
    (lambda: torch.set_grad_enabled(False), "switched autograd off"),
    (lambda: torch.manual_seed(0), "calls torch.manual_seed(0)"),
    (lambda: torch.set_default_device("meta"), "changed the default device to meta")])
def test_torch_global_state_is_put_back_and_the_change_named(change, words):
    torch.manual_seed(123)
    expected = torch.randn(3)
    torch.manual_seed(123)

    def forward(self, x, mask=None):
        change()
        return Good.forward(self, x, mask)
    result = check_multi_head_attention(type("Stateful", (Good,), {"forward": forward}))
    assert not result.passed and words in result.message, result.message
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert torch.get_default_device() == torch.device("cpu") and torch.equal(torch.randn(3), expected)


def test_prints_and_warnings_of_the_readers_forward_are_not_shown(capsys):
    def forward(self, x, mask=None):
        print("shapes", x.shape)
        torch.nn.Softmax()(torch.ones(2, 2, 2))  # warns: implicit dim
        return Good.forward(self, x, mask)
    assert check_multi_head_attention(type("Chatty", (Good,), {"forward": forward})).passed
    out, err = capsys.readouterr()
    assert "shapes" not in out and "Implicit dimension" not in err


def test_run_in_a_checker_of_any_chapter_names_the_hang_with_its_line():
    def spin(x):
        n = 0
        while n >= 0:
            n += 1
    with limited_to(0.2), pytest.raises(CandidateError, match=r"spin\(\) did not return within 0.2 s .*`(while n >= 0:|n \+= 1)`"):
        run(spin, 1, what="spin()")
