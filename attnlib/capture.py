"""What one layer receives and returns inside a model's forward pass, captured by a forward hook.

To check a converted layer against the original, it must see exactly what the original saw in its
model: `layer_io(model, module, input_ids)` runs the whole model once and keeps the module's inputs and
output, so that `attnlib.from_hf(module)(io.x)` can be compared with `io.y` (chapters 14 and 15).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["LayerIO", "layer_io"]


@dataclass(frozen=True)
class LayerIO:
    """What a module got and gave in one call: the call's positional arguments, its keyword arguments
    (the module's own objects, not copies) and its return value; `calls` counts how often the module ran
    in that forward pass (the first call is the one kept)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    calls: int = 1

    @property
    def x(self) -> torch.Tensor:
        """The input hidden states, (B, T, D) for a transformers attention or mixer layer.

        That is the keyword `hidden_states` if the call had it (transformers' layers are called so),
        else the first positional argument."""
        if "hidden_states" in self.kwargs:
            return self.kwargs["hidden_states"]
        if not self.args:
            raise ValueError(f"the module got no positional argument and no hidden_states keyword (keywords: "
                             f"{sorted(self.kwargs)}): read io.kwargs instead of io.x")
        return self.args[0]

    @property
    def y(self) -> torch.Tensor:
        """The output, (B, T, D) for an attention layer.

        The first element when the module returns a tuple (transformers' attention returns
        (output, weights or None)), else the return value itself."""
        return self.output[0] if isinstance(self.output, tuple) else self.output


def layer_io(model: nn.Module, module: nn.Module | str, *inputs: Any, **model_kwargs: Any) -> LayerIO:
    """Run model(*inputs, **model_kwargs) once, under torch.no_grad(), and return what `module` got and gave.

    module: a submodule of model, or its dotted name (`"model.layers.1.self_attn"`). A forward hook on it
    (with_kwargs=True) records its positional and keyword inputs and its output in the first call;
    for a transformers decoder's attention layer io.x is the hidden states (B, T, D) entering it and
    io.y its output (B, T, D). The hook is removed when the forward pass ends, also when it raises.
    A module that is not part of model, or that the forward pass never calls (a layer skipped by this
    input), is a ValueError naming `module`. Objects the pass changes later (a transformers cache in
    io.kwargs) are seen as they are after the whole pass: to rerun the module on io.args and io.kwargs,
    pass use_cache=False to the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    target = _resolve(model, module)
    seen: list[tuple[tuple, dict, Any]] = []

    def hook(_: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        seen.append((args, kwargs, output))

    handle = target.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(*inputs, **model_kwargs)
    finally:
        handle.remove()
    if not seen:
        raise ValueError(f"module {_name(model, target)} ({type(target).__name__}) was never called in "
                         f"model's forward pass: nothing to capture")
    args, kwargs, output = seen[0]
    return LayerIO(args, kwargs, output, calls=len(seen))


def _resolve(model: nn.Module, module: nn.Module | str) -> nn.Module:
    """The submodule that `module` names or is; ValueError / TypeError naming `module` otherwise."""
    if isinstance(module, str):
        try:
            return model.get_submodule(module)
        except AttributeError as e:
            raise ValueError(f"module {module!r} is not a submodule of model ({type(model).__name__}): {e}") from None
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module or a dotted name, got {type(module).__name__}")
    if not any(m is module for m in model.modules()):
        raise ValueError(f"module ({type(module).__name__}) is not a submodule of model ({type(model).__name__}): "
                         f"pass the layer object taken from this model, e.g. model.model.layers[0].self_attn")
    return module


def _name(model: nn.Module, target: nn.Module) -> str:
    """target's dotted name inside model, quoted ('' for the model itself)."""
    return repr(next(name for name, m in model.named_modules() if m is target))
