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

from attnlib.drill import main

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


LOOP = "\nwhile True:\n    pass\n"
OLDER = answer().replace("class Attention", "class AttentionV1").replace(" / math.sqrt(D // self.heads)", "")


def drill(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "attnlib.drill", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kwargs)


# main() in this process: each check runs in a forked child (no new interpreter), so these are quick
@pytest.mark.parametrize("source, name, code, words", [
    (answer(), None, 0, ["PASSED", "`to_qkv` (fused, laid out [q | k | v]) and `to_out`"]),
    (answer("mask"), None, 1, ["FAILED", "an inverted mask"]),
    (GOOD.replace("{fill}", "\n        1 / 0"), None, 1, ["FAILED", "ZeroDivisionError", "at line 16", "1 / 0"]),
    (answer().replace("def forward(self, x, mask=None):", "def forward(self, x, mask=None)"), None, 2,
     ["line 12: SyntaxError", "def forward(self, x, mask=None)"]),
    ("import torch\n", None, 2, ["no nn.Module class"]),
    (answer() + HELPER, None, 0, ["PASSED", "checked Outer; the file's other classes, Attention, Helper"]),
    (answer() + HELPER, "Outer", 0, ["PASSED"]),
    (answer(), "Missing", 2, ["no class Missing", "it defines: Attention"]),
    # issue 28: a fixed class and an older attempt beside it: which one? The reader says, with --name
    (answer() + "\n\n" + OLDER, None, 2, ["2 classes that could be the answer (Attention, AttentionV1)", "--name"]),
    (answer() + "\n\n" + OLDER, "AttentionV1", 1, ["FAILED", "no scale"]),
    # issue 28: sys.exit() at the top of the file is a failure that says so, never a silent pass
    ("import sys\nsys.exit()\n" + answer(), None, 1, ["FAILED", "called sys.exit() at line 2", "__main__"]),
    ("import sys\nsys.exit(0)\n" + answer(), None, 1, ["FAILED", "called sys.exit(0) at line 2"]),
    ("raise SystemExit\n" + answer(), None, 1, ["FAILED", "called sys.exit() at line 1: `raise SystemExit`"]),
    ("import os\nos._exit(0)\n" + answer(), None, 1, ["FAILED", "called os._exit(0) at line 2", "no class could be checked"]),
    ("import os\nos.kill(os.getpid(), 9)\n" + answer(), None, 1, ["FAILED", "called os.kill(", "no class could be checked"]),
    ("import ctypes\nctypes.string_at(0)\n" + answer(), None, 1, ["FAILED", "ended without a verdict", "signal 11"]),
    # issue 28: a loop at import, in __init__, in forward: stopped and named, with the line
    (LOOP + answer(), None, 1, ["FAILED", "loading", "did not finish within 0.5 s", "at line 2: `while True:`"]),
    (answer().replace("super().__init__()", "super().__init__()\n        while True:\n            pass"), None, 1,
     ["FAILED", "Attention(dim=12, heads=3) did not return within 0.5 s", "`while True:`"]),
    (answer().replace("B, T, D = x.shape", "import time; time.sleep(60)"), None, 1,
     ["FAILED", "forward(x) did not return within 0.5 s", "time.sleep(60)"]),
    # code that ignores the timer's signal is stopped all the same; a process that stops itself, by the parent
    ("import signal\n" + answer().replace("B, T, D = x.shape", "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                          "        while True:\n            pass"), None, 1,
     ["FAILED", "forward(x) did not return within 0.5 s"]),
    ("import signal, threading\nsignal.pthread_kill(threading.main_thread().ident, signal.SIGSTOP)\n" + answer(), None, 1,
     ["FAILED", "did not finish within 7 s and was stopped", "kept running past the time limit of 0.5 s"]),
    # torch's global state changed while the file loads; prints are not shown
    ("import torch\ntorch.set_default_dtype(torch.float64)\n" + answer(), None, 1,
     ["FAILED", "loading", "called torch.set_default_dtype(torch.float64)"]),
    ('print("hello from the file")\n' + answer().replace("B, T, D = x.shape", 'print("in forward"); B, T, D = x.shape'),
     None, 0, ["PASSED"]),
])
def test_check_exit_codes(tmp_path, capsys, source, name, code, words):
    path = tmp_path / "answer.py"
    path.write_text(source)
    assert main(["check", str(path), "--seconds", "0.5", *(["--name", name] if name else [])]) == code
    out, err = capsys.readouterr()
    for word in words:
        assert word in out + err, (word, out, err)
    assert "hello" not in out + err and "in forward" not in out + err


def test_check_from_a_terminal(tmp_path):
    """`python -m attnlib.drill check` end to end: exit 0 on a pass, 1 on a failure, the verdict printed."""
    path = tmp_path / "answer.py"
    for source, code, word in ((answer(), 0, "PASSED"), (answer("mask"), 1, "an inverted mask")):
        path.write_text(source)
        done = drill("check", str(path))
        assert done.returncode == code and word in done.stdout, (done.stdout, done.stderr)


def test_check_a_missing_file_is_a_usage_problem(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


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
