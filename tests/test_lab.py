"""`make lab` as a reader uses it: JupyterLab on the .venv's kernel runs a chapter top to bottom.

Starts `make lab` (no browser, a free port, a random token), opens a copy of chapter 1 with its
outputs cleared in headless Chromium, runs *Run > Run All Cells* and reads the notebook's model in
the page once the kernel has finished: every code cell ran, on the .venv's kernel, and none stored an
error. Skips without a browser
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
    args = (f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 --ServerApp.token={token}"
            " --LabApp.expose_app_in_browser=True")
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


# The notebook's own model, read through the app that `--LabApp.expose_app_in_browser` puts on
# `window.jupyterapp`: no save, no status-bar text (the kernel goes idle between the queued cells of
# *Run All*, and a save races the outputs still arriving).
_STATE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model || !panel.sessionContext) return null;
  const model = panel.content.model, cells = [];
  for (let c = 0; c < model.cells.length; c++) {
    const cell = model.cells.get(c);
    if (cell.type !== "code") continue;
    const errors = [];
    for (let i = 0; i < cell.outputs.length; i++) {
      const out = cell.outputs.get(i).toJSON();
      if (out.output_type === "error") errors.push(out.ename + ": " + out.evalue);
    }
    cells.push({count: cell.executionCount, errors});
  }
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {kernel: panel.sessionContext.kernelDisplayName, status: kernel ? kernel.status : null, cells};
}"""


def _state(page) -> dict | None:
    """{kernel: display name, status: the kernel's status, cells: [{count, errors}] per code cell}."""
    return page.evaluate(_STATE)


def _finished(state: dict | None) -> bool:
    """Every code cell has its execution count, or one stored an error (Run All stops there)."""
    if not state or state["status"] != "idle":
        return False
    cells = state["cells"]
    return all(c["count"] for c in cells) or any(c["errors"] for c in cells)


def _run_all(page, deadline: float) -> dict:
    """Run > Run All Cells, then the model once it has finished and stayed so for two polls 1 s apart."""
    page.click("div.lm-MenuBar-itemLabel:text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    previous = None
    while time.monotonic() < deadline:
        time.sleep(1)
        state = _state(page)
        if _finished(state) and state == previous:
            return state
        previous = state
    pytest.fail(f"Run All had not finished after 600 s: {_state(page)}")


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
            page.wait_for_function(f"() => {{ const s = ({_STATE})(); return s && s.status === 'idle'; }}",
                                   timeout=120_000, polling=500)
            state = _run_all(page, deadline=time.monotonic() + 600)
            browser.close()
    finally:  # the copy, and the checkpoint JupyterLab wrote of it on opening
        copy.unlink(missing_ok=True)
        checkpoints = copy.parent / ".ipynb_checkpoints"
        (checkpoints / f"{copy.stem}-checkpoint.ipynb").unlink(missing_ok=True)
        if checkpoints.is_dir() and not any(checkpoints.iterdir()):
            checkpoints.rmdir()
    assert state["kernel"] == KERNEL
    cells = state["cells"]
    errors = [e for c in cells for e in c["errors"]]
    assert not errors, errors
    assert all(c["count"] for c in cells), f"{sum(not c['count'] for c in cells)} of {len(cells)} code cells did not run"
