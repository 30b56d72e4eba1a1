"""`make lab` as a reader uses it: JupyterLab on the .venv's kernel runs a chapter top to bottom.

Starts `make lab` (no browser, a free port, a random token), opens a copy of chapter 1 with its
outputs cleared in headless Chromium, runs *Run > Run All Cells*, saves, and reads the saved copy:
every code cell ran, on the .venv's kernel, and none stored an error. Skips without a browser
(tests/chromium.py).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import CHROMIUM, CHROMIUM_FLAGS, require_browser

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "01_attention_from_scratch.ipynb"
KERNEL = "Python 3 (attention-book .venv)"  # the display name `make lab` installs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab():
    """`make lab` serving chapters/ on 127.0.0.1: yields (base URL, token); stopped afterwards."""
    require_browser()
    port, token = _free_port(), secrets.token_hex(8)
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 --ServerApp.token={token}"
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # the first `make lab` installs JupyterLab
        while True:
            if server.poll() is not None:
                pytest.fail(f"make lab exited {server.returncode}: {server.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("make lab did not answer within 300 s")
                time.sleep(1)
        yield base, token
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _idle(page, state: str, timeout_ms: int) -> None:
    page.wait_for_function(f"() => document.body.innerText.includes('{KERNEL} | {state}')",
                           timeout=timeout_ms, polling=200)


def _save(page, copy: Path) -> dict:
    """Ctrl+S, then the file as saved (read again while the server is still writing it)."""
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
    for _ in range(40):
        try:
            return json.loads(copy.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            time.sleep(0.25)
    return json.loads(copy.read_text(encoding="utf-8"))


def _saved_when_done(page, copy: Path, deadline: float) -> dict:
    """Saves every few seconds until each code cell has run or one stored an error.

    The status bar's "Idle" is no signal: the kernel goes idle between the queued cells of
    *Run All*, so the saved notebook itself is polled."""
    while True:
        saved = _save(page, copy)
        code = [c for c in saved["cells"] if c["cell_type"] == "code"]
        failed = any(o["output_type"] == "error" for c in code for o in c["outputs"])
        if failed or all(c["execution_count"] for c in code) or time.monotonic() > deadline:
            _idle(page, "Idle", 60_000)
            return _save(page, copy)
        time.sleep(3)


def test_a_chapter_runs_top_to_bottom_in_make_lab(lab):
    from playwright.sync_api import sync_playwright

    base, token = lab
    copy = CHAPTER.with_name(f"_labcheck_{secrets.token_hex(4)}.ipynb")  # beside it: same working dir
    nb = json.loads(CHAPTER.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    copy.write_text(json.dumps(nb), encoding="utf-8")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            # a fresh workspace: no tab of an earlier session is restored beside the copy
            page.goto(f"{base}/lab/workspaces/check-{copy.stem}/tree/{copy.name}?token={token}&reset")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            _idle(page, "Idle", 120_000)
            page.click("div.lm-MenuBar-itemLabel:text('Run')")
            page.click("li.lm-Menu-item:has-text('Run All Cells')")
            saved = _saved_when_done(page, copy, deadline=time.monotonic() + 600)
            browser.close()
    finally:
        copy.unlink(missing_ok=True)
    code = [c for c in saved["cells"] if c["cell_type"] == "code"]
    assert saved["metadata"]["kernelspec"]["display_name"] == KERNEL
    assert all(c["execution_count"] for c in code), \
        f"{sum(not c['execution_count'] for c in code)} of {len(code)} code cells did not run"
    errors = [f"{o['ename']}: {o['evalue']}" for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, errors
