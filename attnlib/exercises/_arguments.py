"""What a run of reader code may not change: the arguments the checker gave it.

`snapshot(value)` records an argument before the call; `changes(before, value)` afterwards says what the call
changed in place ('' when nothing): a tensor's values, the items of a list, tuple or dict (tensors in them too),
and a module's parameters and buffers, a function set on one of its submodules' instances
(`decoder.forward = ...`), a submodule's class (`norm.__class__ = ...`) or a method of that class
(`nn.LayerNorm.forward = ...`), and the forward hooks on it or on every module. The checker computes its expected values from these same objects, so a change would
make them agree with whatever the answer returns.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["snapshot", "altered", "module_text"]

class _Module:
    """A module's parameters and buffers (copied), the functions set on its submodules' instances, their classes
    and those classes' methods, and the forward hooks that run with them."""

    def __init__(self, module: nn.Module) -> None:
        self.tensors = {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}
        self.attributes = _methods(module)
        self.behaviour = _behaviour(module)

    def changes(self, module: nn.Module) -> str:
        now = {k: v.detach() for k, v in module.state_dict(keep_vars=True).items()}
        tensors = [k for k, v in self.tensors.items() if k not in now or not _same(v, now[k])]
        methods = _methods(module)
        replaced = [f"{name}.{k}".lstrip(".") for (name, k), v in methods.items()
                    if self.attributes.get((name, k)) is not v]
        behaviour = _behaviour(module)
        other = [k for k in self.behaviour.keys() | behaviour.keys() if self.behaviour.get(k) is not behaviour.get(k)]
        said = ([f"its {'parameter' if len(tensors) == 1 else 'parameters'} {', '.join(tensors[:4])}"] if tensors
                else []) + ([f"{', '.join(replaced[:4])} replaced on the instance"] if replaced else []) + (
                [f"{', '.join(sorted(other)[:4])}"] if other else [])
        return " and ".join(said)


_HOOKS = ("_forward_hooks", "_forward_pre_hooks")


def _behaviour(module: nn.Module) -> dict[str, object]:
    """What decides what each submodule computes besides its tensors: its class, that class's forward and
    __call__, the hooks registered on it, and the hooks registered on every module (by what each is now)."""
    from torch.nn.modules import module as _nn_module

    seen: dict[str, object] = {}
    for name, m in module.named_modules():
        where = f"`{name}`" if name else "the module"
        cls = type(m)
        seen[f"the class of {where}"] = cls
        for method in ("forward", "__call__"):
            seen[f"{cls.__name__}.{method} (a method of the class of {where})"] = getattr(cls, method, None)
        for hooks in _HOOKS:
            for key, hook in getattr(m, hooks, {}).items():
                seen[f"a forward hook on {where} ({hooks.strip('_')} {key})"] = hook
    for hooks in ("_global_forward_hooks", "_global_forward_pre_hooks"):
        for key, hook in getattr(_nn_module, hooks, {}).items():
            seen[f"a forward hook on every module ({hooks.strip('_')} {key})"] = hook
    return seen


def _methods(module: nn.Module) -> dict[tuple[str, str], object]:
    """The functions set on the module's and its submodules' instances (`decoder.forward = fake`), by name."""
    return {(name, k): v for name, m in module.named_modules() for k, v in vars(m).items()
            if callable(v) and not isinstance(v, (nn.Module, torch.Tensor, type))}


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a tensor still equals its copy taken before the call (NaN equals NaN)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    if before.is_floating_point() or before.is_complex():
        return bool(((before == after) | (before.isnan() & after.isnan())).all())
    return torch.equal(before, after)


def snapshot(value: object) -> object:
    """What `altered` compares value with after the call (None: nothing to compare)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, nn.Module):
        return _Module(value)
    if isinstance(value, (list, tuple, dict)):
        try:
            return copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - a tensor deepcopy refuses (a non-leaf one): nothing to compare
            return None
    return None


def _unchanged(before: object, after: object) -> bool:
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor) and _same(before, after.detach())
    if isinstance(before, (list, tuple)):
        return type(before) is type(after) and len(before) == len(after) and all(map(_unchanged, before, after))
    if isinstance(before, dict):
        return (isinstance(after, dict) and before.keys() == after.keys()
                and all(_unchanged(v, after[k]) for k, v in before.items()))
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - objects that cannot be compared safely
        return True


def altered(before: object, value: object) -> str:
    """What the call changed in `value`, which `before` = snapshot(value) recorded ('' when nothing)."""
    if isinstance(before, _Module):
        return before.changes(value)
    return "" if before is None or _unchanged(before, value) else "its values"


def module_text(what: str, changed: list[str]) -> str:
    """The verdict on code that changed modules the checker gave it: `changed` = ["`attn` (its parameters ...)"]."""
    return (f"{what} changed {' and '.join(changed)} in place: the checker computes what your code should return "
            f"from that same module, so it must stay as it was given; work on a copy (copy.deepcopy) if you need to "
            f"change it")
