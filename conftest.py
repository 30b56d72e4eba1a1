"""Test set-up shared by the unit tests and nbval: reproducible, offline, quiet."""

import os

os.environ["PYTHONHASHSEED"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ.pop("MPLBACKEND", None)  # Agg would drop the inline figures nbval expects


def pytest_collectstart(collector):
    """Kernel stderr (warnings, progress bars) varies between runs: nbval does not compare it."""
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
