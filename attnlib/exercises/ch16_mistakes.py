"""The usual mistakes of chapter 16's exercises, each computed the way a reader's code would compute it, for
attnlib.exercises.ch16 to name."""

from __future__ import annotations

import math

import torch

__all__ = ["count_rule", "accept_mistakes", "residual_mistakes", "admit_rule", "admit_mistakes"]


def count_rule(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor, *, ratio=None,
               shift: int = 0, stop: bool = True, plus: int = 0, rejected_too: bool = False) -> int:
    """Drafts accepted under a rule: draft i passes when ratio(p_i(x_i), q_i(x_i), u_i) (default u < p / q)."""
    k = len(drafts)
    rule = ratio or (lambda px, qx, ui: ui * qx < px)
    passed = [bool(rule(float(p[i + shift, drafts[i]]), float(q[i, drafts[i]]), float(u[i]))) for i in range(k)]
    n = next((i for i, ok in enumerate(passed) if not ok), k) if stop else sum(passed)
    if rejected_too and n < k:
        return n + 1
    return n + (plus if n == k or plus < 0 else 0)


def accept_mistakes(cases: list[tuple]) -> dict[str, list[int]]:
    """Each mistake's counts on every case (p, q, drafts, u)."""
    def over(**rule) -> list[int]:
        return [count_rule(*case, **rule) for case in cases]
    return {
        "the ratio upside down: u < q(x) / p(x) where the rule is u < p(x) / q(x)": over(ratio=lambda px, qx, u: u * px < qx),
        "u > p(x) / q(x): a draft passes when the draw is above the ratio, not below it":
            over(ratio=lambda px, qx, u: u * qx > px),
        "no stop at the first rejection: every draft that passes is counted, but a draft after a rejected one was "
        "drawn from the wrong context and must be dropped": over(stop=False),
        "u left out: a draft passes when p(x) >= q(x), so a draft the target likes less is never kept, and the "
        "output is biased towards the draft": over(ratio=lambda px, qx, u: px >= qx),
        "q(x) left out: u < p(x) is the rule for a point-mass (deterministic) draft only; with a sampled draft, "
        "divide by q(x)": over(ratio=lambda px, qx, u: u < px),
        "p read one position late: draft i must be scored by p_i, the target's distribution at its own position, "
        "p[i], not p[i + 1]": over(shift=1),
        "the bonus token counted: when all k drafts pass, return k (the token drawn from p_{k+1} comes after them)":
            over(plus=1),
        "the rejected draft counted: at the first rejection i, i drafts were accepted, not i + 1": over(rejected_too=True),
        "u <= p(x) / q(x): a draft the target gives probability 0 is accepted when u = 0; use <":
            over(ratio=lambda px, qx, u: u * qx <= px),
        "the greedy rule (a draft kept when it is the target's argmax) used for sampling: a sampled draft is kept "
        "with probability min(1, p(x) / q(x))": [count_rule(*case, ratio=_argmax_rule(case[0], case[2])) for case in cases],
        "u compared with log p(x) - log q(x): the ratio is p(x) / q(x), not its logarithm":
            over(ratio=lambda px, qx, u: px > 0 and u < math.log(px) - math.log(qx)),
    }


def _argmax_rule(p: torch.Tensor, drafts: torch.Tensor):
    """A ratio rule that passes draft i when it is p_i's argmax (it finds i by matching p_i(x_i))."""
    best = {round(float(p[i, x]), 15): int(p[i].argmax()) == int(x) for i, x in enumerate(drafts.tolist())}
    return lambda px, qx, u: best.get(round(px, 15), False)


def residual_mistakes(p: torch.Tensor, q: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each mistake's residual for p, q (..., V)."""
    norm = lambda x: x / x.sum(-1, keepdim=True)  # noqa: E731
    plus = (p - q).clamp(min=0)
    return {
        "not renormalised: max(0, p - q) sums to 1 - Σ min(p, q), divide it by its sum": plus,
        "p - q without max(0, ·): a distribution cannot hold negative probabilities": p - q,
        "(p - q) / Σ(p - q) without max(0, ·): p and q both sum to 1, so Σ(p - q) is 0 up to rounding and the "
        "division blows up; take max(0, p - q) first, then divide by its sum": norm(p - q),
        "max(0, q - p): the draft's excess, where the target's, max(0, p - q), is what a rejection must add": norm((q - p).clamp(min=0)),
        "|p - q| renormalised: only where p exceeds q is mass missing": norm((p - q).abs()),
        "softmax of max(0, p - q): the residual is divided by its sum, not exponentiated": plus.softmax(-1),
        "normalised over the wrong dimension (dim=0, across rows, not over the vocabulary)": plus / plus.sum(0, keepdim=True),
        "p with the drafted tokens removed, renormalised: right only for a point-mass draft; a sampled draft's "
        "residual is max(0, p - q)": norm(p * (q == 0)),
        "p renormalised: on a rejection, drawing from p again counts the mass min(p, q) twice": norm(p),
        "normalised over every element at once (r / r.sum()), not each row over the last dimension": plus / plus.sum(),
        "softmax(p - q): p and q are probabilities, not logits; take max(0, p - q) and divide by its sum":
            (p - q).softmax(-1),
        "min(p, q) renormalised: that is the mass a draft is accepted with; the residual is max(0, p - q)": norm(torch.minimum(p, q)),
    }


def admit_rule(waiting: list[tuple[int, int]], reserved: int, running: int, max_batch_size: int,
               max_blocks: int, block_size: int, *, need=None, batch: bool = True, count_running: bool = True,
               count_reserved: bool = True, strict: bool = False, skip: bool = False, batch_gt: bool = False,
               accumulate: bool = True) -> int:
    """How many waiting requests join under a rule (default: the book's)."""
    need = need or (lambda T, n: -(-(T + n - 1) // block_size))
    joined = 0
    used = reserved if count_reserved else 0
    for T, n in waiting:
        size = (running if count_running else 0) + joined
        full = batch and (size > max_batch_size if batch_gt else size >= max_batch_size)
        fits = used + need(T, n) < max_blocks if strict else used + need(T, n) <= max_blocks
        if full or not fits:
            if skip and not full:
                continue
            break
        used, joined = used + (need(T, n) if accumulate else 0), joined + 1
    return joined


def admit_mistakes(cases: list[tuple]) -> dict[str, list[int]]:
    """Each mistake's answers on every case (waiting, reserved, running, max_batch_size, max_blocks, block_size)."""
    def over(**rule) -> list[int]:
        return [admit_rule(*case, **{k: (v(case[5]) if k == "need" else v) for k, v in rule.items()}) for case in cases]
    return {
        "one block too many whenever T + n - 1 positions fill their blocks exactly: ceil((T + n) / block_size) "
        "(= (T + n - 1) // block_size + 1) counts the last new token's position, which is never cached (the last "
        "token is not fed back); reserve ceil((T + n - 1) / block_size)": over(need=lambda b: lambda T, n: -(-(T + n) // b)),
        "blocks rounded down (floor division): a partly filled block is still a whole block, use ceil":
            over(need=lambda b: lambda T, n: (T + n - 1) // b),
        "only the prompt's blocks reserved: the request's generated tokens then need blocks the pool may not have "
        "(vLLM would have to preempt it); reserve ceil((T + n - 1) / block_size)":
            over(need=lambda b: lambda T, n: -(-T // b)),
        "max_batch_size ignored": over(batch=False),
        "the running requests left out of the batch size: running + joined must stay <= max_batch_size":
            over(count_running=False),
        "the running requests' reserved blocks left out of the budget": over(count_reserved=False),
        "the budget as a strict bound: a request that fills the pool exactly (reserved + need = max_blocks) fits":
            over(strict=True),
        "running + joined > max_batch_size: one request past the batch size is admitted; stop when it reaches "
        "max_batch_size (>=)": over(batch_gt=True),
        "the admitted requests' blocks not added to reserved while admitting: each request is checked against the "
        "pool alone, and together they overflow it": over(accumulate=False),
        "a request that does not fit skipped over and later ones admitted: first come, first served stops at the "
        "first that does not fit (otherwise a long request could wait forever)": over(skip=True),
    }
