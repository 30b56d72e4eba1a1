"""Test set-up shared by the unit tests and nbval: reproducible, offline, quiet."""

import os
import sys

import pytest

os.environ["PYTHONHASHSEED"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ.pop("MPLBACKEND", None)  # Agg would drop the inline figures nbval expects


def pytest_collectstart(collector):
    """Kernel stderr (warnings, progress bars) varies between runs: nbval does not compare it."""
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


def pytest_collection_modifyitems(items):
    """Mark `built_book` every test of a module that reads the built book (imports HTML from
    tests/built_book.py): `make test` runs the rest first (-m "not built_book"), nbval included, then
    builds the book from the outputs nbval has checked, then these (-m built_book)."""
    built_book = sys.modules.get("built_book")
    if built_book is None:
        return
    for item in items:
        module = getattr(item, "module", None)  # None for nbval's cells
        if module is not None and any(value is built_book.HTML for value in vars(module).values()):
            item.add_marker(pytest.mark.built_book)
