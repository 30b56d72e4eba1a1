"""The build-path check of test_book_offline flags real paths and nothing else, whatever Python runs it.

Each case passes the build paths explicitly, so it holds on any machine: Debian's Python (prefix
/usr), pyenv's, a venv under the home directory.
"""

import base64
import json

import pytest
from machine_paths import machine_paths, reader_text

CHECKOUT = "/home/reader/src/attention-book"
PATHS = ["/usr", CHECKOUT, "/home/reader"]
# A payload whose base64 text starts a line with "/usr/" by chance (chapter 6's figure held "/usr"
# on Debian's Python): read as text, it would look like a path.
PNG = "/usr/AAA" + base64.b64encode(bytes(range(60))).decode()
assert base64.b64decode(PNG, validate=True) and machine_paths(f'"{PNG}"', ["/usr"]) == ["/usr"]


def _notebook(tmp_path, *outputs):
    path = tmp_path / "chapter.ipynb"
    cell = {"cell_type": "code", "source": "x", "metadata": {}, "execution_count": 1, "outputs": list(outputs)}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_an_image_payload_that_happens_to_hold_usr_is_not_a_path(tmp_path):
    png = {"output_type": "display_data", "metadata": {},
           "data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"}}
    assert machine_paths(reader_text(_notebook(tmp_path, png)), PATHS) == []


def test_a_traceback_frame_under_usr_is_flagged(tmp_path):
    error = {"output_type": "error", "ename": "ValueError", "evalue": "bad",
             "traceback": ['File \x1b[0;32m/usr/lib/python3.11/json/decoder.py:3\x1b[0m, in decode', "ValueError: bad"]}
    assert machine_paths(reader_text(_notebook(tmp_path, error)), PATHS) == ["/usr", "lib/python3.11/"]
    plain = 'File "/usr/lib/python3.11/json/decoder.py", line 3, in decode'
    assert machine_paths(plain, PATHS) == ["/usr", "lib/python3.11/"]


def test_a_warning_naming_the_checkout_is_flagged(tmp_path):
    stream = {"output_type": "stream", "name": "stdout",
              "text": f"done\n{CHECKOUT}/attnlib/mha.py:40: UserWarning: something\n"}
    assert machine_paths(reader_text(_notebook(tmp_path, stream)), PATHS) == [CHECKOUT, "/home/reader"]


def test_html_data_uris_are_not_read_but_html_text_is(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(f'<p>ok</p><img src="data:image/png;base64,{PNG}" alt="figure">')
    assert machine_paths(reader_text(page), PATHS) == []
    page.write_text('<pre><span class="ansi-green-fg">/home/reader/.venv/lib/python3.11/site-packages/torch/nn.py</span></pre>')
    assert machine_paths(reader_text(page), PATHS) == ["/home/reader", "lib/python3.11/"]


@pytest.mark.parametrize("text", ["a/usr/b", "/usrx/lib", "the /usr prefix", "weights/usr_data", "x+/usr/"])
def test_a_path_is_matched_as_a_path_not_as_four_letters(text):
    assert machine_paths(text, ["/usr"]) == []
