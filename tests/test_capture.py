"""attnlib.layer_io: a layer's inputs and output inside a model's forward pass, the hook always removed,
and clear errors for a module that is not in the model or is never called."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from attnlib import layer_io
from hf_tiny import tiny

torch.set_num_threads(1)


class Toy(nn.Module):
    """x -> a(x) -> b(x, scale=2.0); `unused` is never called; `shared` runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.shared, self.unused = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, fail: bool = False) -> torch.Tensor:
        h = self.shared(self.shared(self.a(x)))
        if fail:
            raise RuntimeError("the model's own error")
        return h


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return Toy()


def hooks(m: nn.Module) -> int:
    return sum(len(sub._forward_hooks) for sub in m.modules())


def test_captures_the_input_and_output_of_a_transformers_attention_layer():
    model = tiny(LlamaForCausalLM, LlamaConfig)
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    attn = model.model.layers[1].self_attn
    io = layer_io(model, attn, ids, use_cache=False)  # keywords go to model; no cache: the layer can rerun
    assert io.x.shape == io.y.shape == (2, 7, 64) and io.calls == 1
    assert isinstance(io.output, tuple) and io.y is io.output[0]
    with torch.no_grad():  # rerun the layer on what it got: the same output
        again = attn(*io.args, **io.kwargs)[0]
    assert torch.equal(again, io.y)
    assert not io.y.requires_grad  # run under no_grad
    by_name = layer_io(model, "model.layers.1.self_attn", ids, use_cache=False)
    assert torch.equal(by_name.x, io.x) and torch.equal(by_name.y, io.y)
    assert hooks(model) == 0


def test_positional_input_and_model_keywords_are_passed_and_kept(toy):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    io = layer_io(toy, toy.a, x)
    assert io.kwargs == {} and io.args[0] is x and io.x is x
    torch.testing.assert_close(io.y, toy.a(x))
    shared = layer_io(toy, toy.shared, x)
    assert shared.calls == 2  # the first call is kept: its input is a's output
    torch.testing.assert_close(shared.x, toy.a(x))
    assert hooks(toy) == 0


def test_the_hook_is_removed_when_the_forward_pass_raises(toy):
    with pytest.raises(RuntimeError, match="the model's own error"):
        layer_io(toy, toy.a, torch.randn(3, 4), fail=True)
    assert hooks(toy) == 0


def test_a_module_never_called_is_a_value_error_naming_it(toy):
    with pytest.raises(ValueError, match=r"module 'unused' \(Linear\) was never called in model's forward pass"):
        layer_io(toy, toy.unused, torch.randn(3, 4))
    assert hooks(toy) == 0


def test_a_module_not_in_the_model_is_a_value_error_naming_the_argument(toy):
    with pytest.raises(ValueError, match=r"module \(Linear\) is not a submodule of model \(Toy\)"):
        layer_io(toy, nn.Linear(4, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"module 'layers.0' is not a submodule of model \(Toy\)"):
        layer_io(toy, "layers.0", torch.randn(3, 4))
    with pytest.raises(TypeError, match="module must be a torch.nn.Module or a dotted name, got int"):
        layer_io(toy, 3, torch.randn(3, 4))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        layer_io(lambda x: x, toy.a, torch.randn(3, 4))
    assert hooks(toy) == 0


def test_x_without_a_positional_input_says_where_to_look(toy):
    class KeywordOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x):
            return self.inner(input=x)

    m = KeywordOnly()
    io = layer_io(m, m.inner, torch.ones(2))
    assert torch.equal(io.kwargs["input"], torch.ones(2))
    with pytest.raises(ValueError, match=r"no hidden_states keyword \(keywords: \['input'\]\): read io.kwargs"):
        io.x
