"""`python -m attnlib.drill check|practice` end to end, in a subprocess: exit codes, verdicts, the clock."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOOD = '''\
import math
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_qkv, self.to_out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = self.to_qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
        s = q @ k.transpose(-2, -1) / math.sqrt(D // self.heads){fill}
        return self.to_out((s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D))
'''
MASKED = '''
        if mask is not None:
            s = s.masked_fill({m}, float("-inf"))'''
HELPER = '''

class Helper(nn.Module):
    def forward(self, x):
        return x


class Outer(Attention):
    pass
'''


def answer(mask: str = "~mask") -> str:
    return GOOD.replace("{fill}", MASKED.replace("{m}", mask))


def drill(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "attnlib.drill", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kwargs)


@pytest.mark.parametrize("source, name, code, words", [
    (answer(), None, 0, ["PASSED", "`to_qkv` (fused, laid out [q | k | v]) and `to_out`"]),
    (answer("mask"), None, 1, ["FAILED", "an inverted mask"]),
    (GOOD.replace("{fill}", "\n        1 / 0"), None, 1, ["FAILED", "ZeroDivisionError", "at line 16", "1 / 0"]),
    (answer().replace("def forward(self, x, mask=None):", "def forward(self, x, mask=None)"), None, 2,
     ["line 12: SyntaxError", "def forward(self, x, mask=None)"]),
    ("import torch\n", None, 2, ["no nn.Module class"]),
    (answer() + HELPER, None, 2, ["several nn.Module classes (Attention, Helper, Outer)", "--name"]),
    (answer() + HELPER, "Outer", 0, ["PASSED"]),
    (answer(), "Missing", 2, ["no class Missing", "it defines: Attention"]),
])
def test_check_exit_codes(tmp_path, source, name, code, words):
    path = tmp_path / "answer.py"
    path.write_text(source)
    done = drill("check", str(path), *(["--name", name] if name else []))
    assert done.returncode == code, (done.stdout, done.stderr)
    for word in words:
        assert word in done.stdout + done.stderr, (word, done.stdout, done.stderr)


def test_check_a_missing_file_is_a_usage_problem(tmp_path):
    done = drill("check", str(tmp_path / "nope.py"))
    assert done.returncode == 2 and "no such file" in done.stderr


@pytest.fixture
def practice():
    """practice(path, sigint_ignored=False) -> a Session; any still running is killed at teardown."""
    started: list[Session] = []

    def start(path: Path, sigint_ignored: bool = False) -> Session:
        started.append(Session(path, sigint_ignored))
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(timeout=30)


class Session:
    """`practice` running in the background; its stdout lines arrive on a queue."""

    def __init__(self, path: Path, sigint_ignored: bool = False) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-m", "attnlib.drill", "practice", str(path), "--poll", "0.05"]
        if sigint_ignored:  # started as a script's background job is: SIGINT ignored, kept across exec
            args = ["/bin/sh", "-c", "trap '' INT; exec \"$@\"", "sh", *args]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def until(self, word: str, timeout: float = 60) -> list[str]:
        """The lines read until one contains `word`."""
        got, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                got.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue
            if word in got[-1]:
                return got
        raise AssertionError(f"no line with {word!r} in {got}")


def save(path: Path, text: str, step: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(time.time_ns() + step * 10**9,) * 2)  # a new mtime even within the clock's resolution


def test_practice_writes_a_starter_names_a_wrong_save_and_ends_on_a_correct_one(tmp_path, practice):
    path = tmp_path / "mha.py"
    session = practice(path)
    assert "class MultiHeadAttention(nn.Module)" in "".join(session.until("Ctrl-C to stop"))
    assert "raise NotImplementedError" in path.read_text() and "# The interview drill" in path.read_text()
    save(path, answer("mask"), 1)
    wrong = session.until("FAILED")[-1]
    assert wrong.startswith("[0:0") and "an inverted mask" in wrong, wrong
    save(path, answer(), 2)
    lines = session.until("Passed in")
    assert any(line.startswith("[0:") and "PASSED" in line for line in lines), lines
    assert "within the 5:00 goal" in lines[-1], lines
    assert session.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_practice_ctrl_c_ends_with_exit_1_and_a_summary(tmp_path, practice, sigint_ignored):
    path = tmp_path / "mha.py"
    path.write_text(answer("mask"))
    session = practice(path, sigint_ignored)
    session.until("Ctrl-C to stop")
    save(path, answer("mask"), 1)
    session.until("FAILED")
    session.proc.send_signal(signal.SIGINT)
    assert session.proc.wait(timeout=30) == 1
    summary = session.until("Stopped at")[-1]
    assert "after 1 checked saves; last verdict: FAILED" in summary, summary
