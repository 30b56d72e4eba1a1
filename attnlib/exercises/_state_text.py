"""The words for a change a reader's code left in global state (_state finds and undoes the change)."""

from __future__ import annotations

__all__ = ["describe", "replaced_text", "modes_text"]


def replaced_text(who: str, replaced: list[str]) -> str:
    """Why replacing torch's own functions is refused, naming them."""
    owner = "torch's" if all(n.startswith("torch") for n in replaced) else "torch's or attnlib's"
    return (f"{who} replaced {owner} own {', '.join(replaced)} (an assignment such as `torch.equal = ...`): every "
            f"check, yours and the checker's, would then use the replacement. The checker put {owner} own back and "
            f"compared with saved references; leave {owner} functions alone")


def describe(what: str, before: tuple, after: tuple, seeded: list, replaced: list[str]) -> list[str]:
    """Each change in plain words, with why it matters."""
    found = [replaced_text(what, replaced)] if replaced else []
    if after[0] != before[0]:
        found.append(f"{what} called torch.set_default_dtype({after[0]}) and left it set: every tensor created "
                     f"afterwards in your session would be {after[0]}. The checker set the default dtype back to "
                     f"{before[0]}; change the dtype of your own tensors instead (x.double(), dtype=...)")
    if after[1] != before[1]:
        state = "off" if before[1] else "on"
        found.append(f"{what} switched autograd {state} (torch.set_grad_enabled({not before[1]}), or a "
                     f"torch.no_grad() entered and never left) and left it {state}: the grad mode is global, so "
                     f"training would learn nothing. The checker switched it back; use a `with torch.no_grad():` "
                     f"block, which restores it")
    if after[2] != before[2]:
        found.append(f"{what} changed the default device to {after[2]} and left it; the checker set it back to "
                     f"{before[2]}")
    if seeded:
        found.append(f"{what} calls torch.manual_seed({seeded[0]}): it resets the global random generator every "
                     f"time, so dropout would drop the same units at every step and every random draw in your "
                     f"session would repeat. Seed once, outside the module")
    return found


def modes_text(what: str, modes: list[tuple[str, object]]) -> list[str]:
    """The words for an inference mode left on and for blanket warnings filters (_state._restore_modes)."""
    found = []
    for kind, detail in modes:
        if kind == "inference":
            found.append(f"{what} entered torch.inference_mode() and never left it (`__enter__()` without "
                         f"`__exit__()`): every tensor made afterwards in your session would be an inference tensor "
                         f"that autograd refuses. The checker switched it off; use a `with torch.inference_mode():` "
                         f"block, which leaves it")
        else:
            found.append(f"{what} called warnings.simplefilter({detail!r}) (or filterwarnings) and left it set: "
                         + ("every warning in the rest of your session would be raised as an exception" if
                            detail == "error" else "every warning in the rest of your session would be " +
                            ("hidden" if detail == "ignore" else f"handled as {detail!r}"))
                         + ". The checker put the warnings filters back; use a `with warnings.catch_warnings():` "
                         "block, which restores them")
    return found
