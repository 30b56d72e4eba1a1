"""A small sequence-to-sequence model around attnlib.Transformer, a toy task, training and greedy decoding.

The task: a date written in words, day first, becomes its ISO form, year first,
    "twenty third of march nineteen ninety nine" -> "1999-03-23",
so each output digit must find its word in the source: cross-attention has to learn an alignment
that runs against the word order. The model: token embeddings (initialised with std D^-1/2 and
scaled by sqrt(D), as in tensor2tensor) plus sinusoidal positions, the Transformer, and a linear
projection to the output vocabulary.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib.positional import sinusoidal
from attnlib.cross_attention import DecoderCache
from attnlib.encoder import _check_ids
from attnlib.transformer import Transformer

__all__ = ["SRC_VOCAB", "TGT_VOCAB", "PAD", "BOS", "date_words", "date_split", "encode_dates", "shift_right",
           "Seq2Seq", "lr_factor", "train", "greedy_decode", "exact_match"]

_ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINALS = ["", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
             "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
             "eighteenth", "nineteenth", "twentieth", *[""] * 9, "thirtieth", ""]
_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
PAD, BOS = "<pad>", "<bos>"
SRC_VOCAB = (PAD, *sorted(set(_ONES + _TENS + _ORDINALS + _MONTHS + ["of", "oh", "hundred", "thousand"]) - {""}))
TGT_VOCAB = (PAD, BOS, *"0123456789-")
FIRST_DAY, LAST_DAY = datetime.date(1900, 1, 1), datetime.date(2099, 12, 31)


def _number(n: int) -> list[str]:
    """1..99 in words: 7 -> ['seven'], 42 -> ['forty', 'two']."""
    return [_ONES[n]] if n < 20 else [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])


def date_words(date) -> list[str]:
    """A datetime.date in words, day first:
    2023-03-01 -> ['first', 'of', 'march', 'two', 'thousand', 'twenty', 'three']."""
    d, y = date.day, date.year % 100
    day = [_ORDINALS[d]] if _ORDINALS[d] else [_TENS[d // 10], _ORDINALS[d % 10]]
    if date.year >= 2000:
        year = ["two", "thousand"] + (_number(y) if y else [])
    else:
        year = ["nineteen"] + (["hundred"] if y == 0 else ["oh", _ONES[y]] if y < 10 else _number(y))
    return day + ["of", _MONTHS[date.month - 1]] + year


def date_split(n_train: int, n_test: int, seed: int = 0) -> tuple[list, list]:
    """Two disjoint lists of distinct datetime.date between 1900-01-01 and 2099-12-31, drawn with Python's
    random.Random(seed) (the same on every machine): held-out dates never appear in training."""
    days = (LAST_DAY - FIRST_DAY).days + 1
    if n_train + n_test > days:
        raise ValueError(f"n_train + n_test = {n_train + n_test} is more than the {days} dates there are")
    picked = random.Random(seed).sample(range(days), n_train + n_test)
    dates = [FIRST_DAY + datetime.timedelta(days=i) for i in picked]
    return dates[:n_train], dates[n_train:]


def encode_dates(dates: list) -> tuple[torch.Tensor, torch.Tensor]:
    """For N datetime.date: src (N, S) word ids, right-padded with PAD (id 0), and tgt (N, 10) ids of
    the ISO characters."""
    words = [date_words(d) for d in dates]
    S = max(map(len, words))
    src = torch.tensor([[SRC_VOCAB.index(w) for w in ws] + [0] * (S - len(ws)) for ws in words])
    tgt = torch.tensor([[TGT_VOCAB.index(c) for c in d.isoformat()] for d in dates])
    return src, tgt


def shift_right(tgt: torch.Tensor, bos: int = TGT_VOCAB.index(BOS)) -> torch.Tensor:
    """Teacher forcing's decoder input (B, T): BOS, then tgt without its last token, so that position t
    sees the true tokens before t and is trained to predict tgt[:, t]."""
    return torch.cat([torch.full_like(tgt[:, :1], bos), tgt[:, :-1]], dim=1)


class Seq2Seq(nn.Module):
    """Token ids in, logits out: embeddings · sqrt(D) + sinusoidal positions -> Transformer -> Linear(D, vocab).

    The embedding tables start with std D^-1/2 (tensor2tensor's initialisation, for which the paper's
    factor sqrt(D) was made): a word vector then starts about sqrt(D) long, the length of a sinusoidal
    row times sqrt(2), instead of D long with nn.Embedding's default std 1.
    """

    def __init__(self, d_model: int = 64, num_heads: int = 4, num_layers: int = 2, dim_feedforward: int = 256,
                 dropout: float = 0.0, *, src_vocab: int = len(SRC_VOCAB), tgt_vocab: int = len(TGT_VOCAB),
                 max_len: int = 64) -> None:
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(src_vocab, d_model), nn.Embedding(tgt_vocab, d_model)
        for table in (self.src_embed, self.tgt_embed):
            nn.init.normal_(table.weight, std=d_model ** -0.5)
        self.register_buffer("positions", sinusoidal(max_len, d_model), persistent=False)  # (max_len, D)
        self.transformer = Transformer(d_model, num_heads, num_layers, num_layers, dim_feedforward, dropout)
        self.project = nn.Linear(d_model, tgt_vocab)

    def embed(self, table: nn.Embedding, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """ids (B, L) at positions start..start+L-1 -> (B, L, D)."""
        return table(ids) * math.sqrt(table.embedding_dim) + self.positions[start:start + ids.shape[1]]

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src ids (B, S) -> memory (B, S, D) and its padding mask (B, 1, 1, S), True = real word."""
        _check_ids(src, "src", self.src_embed.num_embeddings, "the source vocabulary")
        mask = _masks.padding_mask(src != 0)
        return self.transformer.encode(self.embed(self.src_embed, src), mask), mask

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in = shift_right(tgt) (B, T) -> logits (B, T, vocab) for tgt."""
        memory, mask = self.encode(src)
        _check_ids(tgt_in, "tgt_in", self.tgt_embed.num_embeddings, "the target vocabulary")
        if tgt_in.shape[0] != src.shape[0] or tgt_in.shape[1] > len(self.positions):
            raise ValueError(f"tgt_in of shape {tuple(tgt_in.shape)} is not (B, T) with B={src.shape[0]} "
                             f"and T <= max_len={len(self.positions)}")
        return self.project(self.transformer.decode(self.embed(self.tgt_embed, tgt_in), memory, memory_mask=mask))


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """The learning rate of `step` (from 0) over the base rate: the smaller of a linear warm-up, (step + 1) / warmup,
    and a cosine that starts at step 0 and reaches 0 at `steps`, (1 + cos(pi · step / steps)) / 2."""
    return min((step + 1) / warmup, 0.5 + 0.5 * math.cos(math.pi * min(step / steps, 1.0)))


def train(model: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor, *, steps: int, batch_size: int = 64,
          lr: float = 3e-3, warmup: int = 100, seed: int = 0,
          callback: Callable[[int, float], None] | None = None) -> list[float]:
    """Teacher-forced cross-entropy with Adam at lr · lr_factor(step, steps, warmup); returns the loss per step.

    Batches are drawn with torch.Generator().manual_seed(seed); callback(step, loss) runs after each step.
    """
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, warmup))
    model.train()
    losses = []
    for step in range(steps):
        idx = torch.randint(len(src), (batch_size,), generator=generator)
        logits = model(src[idx], shift_right(tgt[idx]))                    # (batch, T, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[idx].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, losses[-1])
    return losses


@torch.inference_mode()
def greedy_decode(model: Seq2Seq, src: torch.Tensor, length: int = 10, *, use_cache: bool = True) -> torch.Tensor:
    """src (B, S) -> (B, length) target ids, each the argmax given the ones before it.

    The source is encoded once. With use_cache, each step feeds one token and a DecoderCache keeps
    the self-attention keys and values and the memory's cross-attention keys and values; without,
    every step re-runs the decoder over all tokens so far.
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 0 < length < len(model.positions):
        raise ValueError(f"length must be an int in [1, {len(model.positions) - 1}] (max_len - 1), got {length!r}")
    memory, mask = model.encode(src)
    out = torch.full((src.shape[0], length + 1), TGT_VOCAB.index(BOS), dtype=torch.long, device=src.device)
    cache = DecoderCache() if use_cache else None
    for t in range(length):
        start = t if use_cache else 0
        x = model.embed(model.tgt_embed, out[:, start:t + 1], start)      # (B, 1 or t + 1, D)
        y = model.transformer.decode(x, memory, memory_mask=mask, cache=cache)
        out[:, t + 1] = model.project(y[:, -1]).argmax(dim=-1)
    return out[:, 1:]


def exact_match(pred: torch.Tensor, tgt: torch.Tensor) -> float:
    """The fraction of rows of pred (N, T) equal to tgt (N, T) at every position."""
    return (pred == tgt).all(dim=1).float().mean().item()
