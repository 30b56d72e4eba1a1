"""Attention heatmaps and head grids (matplotlib + seaborn), labelled the same way in every chapter.

Rows are queries (what attends), columns are keys (what is attended to); a weight map's rows sum
to 1 (or are all 0 for a query with nothing to attend to). A mask is drawn with the same layout:
True (may attend) is dark.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import seaborn as sns
import torch

__all__ = ["heatmap", "head_grid"]


def _labels(tokens: Sequence[str] | None, n: int) -> list[str]:
    """Tick labels: the tokens if given (one per position), else the positions 0..n-1."""
    if tokens is None:
        return [str(i) for i in range(n)]
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} tokens for an axis of length {n}")
    return list(tokens)


def heatmap(weights: torch.Tensor, *, queries: Sequence[str] | None = None,
            keys: Sequence[str] | None = None, title: str = "", ax: plt.Axes | None = None,
            annot: bool | None = None, cbar_label: str = "weight") -> plt.Axes:
    """Draw one (T, S) map: a weight matrix (values in [0, 1]) or a bool mask (True = may attend).

    queries / keys label the rows / columns (default: positions). annot writes each value in its
    cell (default: only when T·S <= 64, so small worked examples show their numbers).
    """
    w = torch.as_tensor(weights).detach().to("cpu")
    if w.dim() != 2:
        raise ValueError(f"weights of shape {tuple(w.shape)} is not one (T, S) map; pick a batch and head")
    T, S = w.shape
    is_mask = w.dtype == torch.bool
    ax = ax if ax is not None else plt.subplots(figsize=(min(1.0 + 0.5 * S, 9.0), min(0.8 + 0.45 * T, 7.0)))[1]
    annot = T * S <= 64 if annot is None else annot
    sns.heatmap(w.float().numpy(), ax=ax, vmin=0.0, vmax=1.0, cmap="Greys" if is_mask else "viridis",
                annot=annot and not is_mask, fmt=".2f", square=False, linewidths=0.5 if is_mask else 0,
                cbar=not is_mask, cbar_kws=None if is_mask else {"label": cbar_label},
                xticklabels=_labels(keys, S), yticklabels=_labels(queries, T))
    ax.set_xlabel("key position j (attended to)" if keys is None else "key (attended to)")
    ax.set_ylabel("query position i" if queries is None else "query (attending)")
    ax.tick_params(axis="x", labelrotation=90 if keys is not None else 0)
    ax.tick_params(axis="y", labelrotation=0)
    if is_mask and not title:
        title = "mask (dark = may attend)"
    ax.set_title(title)
    return ax


def head_grid(weights: Sequence[torch.Tensor] | torch.Tensor, tokens: Sequence[str] | None = None, *,
              title: str = "", cell_inches: float = 1.6) -> plt.Figure:
    """A grid of every layer (rows) and head (columns): weights is [(H, T, T)] per layer or (L, H, T, T).

    Each small map is one head's (T, T) weights; tokens label the first column's rows and the last
    row's columns when the maps are large enough to read them (else the maps are an overview, in
    token order). Colour scale 0..1, shared by all maps.
    """
    w = torch.stack(list(weights)) if not torch.is_tensor(weights) else weights
    w = w.detach().float().cpu()
    if w.dim() != 4:
        raise ValueError(f"weights of shape {tuple(w.shape)} is not (L, H, T, T); pick one batch element")
    L, H, T, _ = w.shape
    fig, axes = plt.subplots(L, H, figsize=(cell_inches * H + 1.0, cell_inches * L + 0.6), squeeze=False)
    labels = _labels(tokens, T)
    readable = cell_inches * 72 / T >= 7  # points per row: smaller tick labels cannot be read
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            image = ax.imshow(w[layer, head].numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
            ax.set_xticks(range(T) if readable else [], labels if readable and layer == L - 1 else [],
                          rotation=90, fontsize=6)
            ax.set_yticks(range(T) if readable else [], labels if readable and head == 0 else [], fontsize=6)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}\nquery", fontsize=8)
    fig.supxlabel("key (attended to)" + ("" if readable else ", in token order left to right"), fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.colorbar(image, ax=axes, shrink=0.6, label="weight")
    return fig
