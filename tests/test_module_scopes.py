"""Flax NNX and Equinox name no module in the ops they trace; an audit names each module's
ops by its path from the module first called, so that a program reads layer by layer."""

import collections
from collections.abc import Callable

import pytest

import shardscope
from helpers import program_module


def _by_layer(audit) -> dict[str, dict[tuple[str, str, str], int]]:
    """Each layer's bytes sent per device by scope inside ``blocks/<i>/``, kind and axes
    (a combined collective's arrays each in their own scope), keyed by the layer's index."""
    layers: dict[str, dict[tuple[str, str, str], int]] = collections.defaultdict(dict)
    for row in audit.by_scope():
        parts = row.scope.split("/")
        if "blocks" in parts:
            i = parts.index("blocks")
            rest = "/".join(parts[i + 2 :])
            layers[parts[i + 1]][(rest, row.kind, row.axes)] = row.traffic_bytes
    return layers


@pytest.mark.parametrize(
    "program, root", [("nnx_llama", "Decoder"), ("eqx_transformer", "Decoder")]
)
def test_each_layer_of_an_nnx_or_equinox_model_is_its_own_scope(program, root):
    module = program_module(program)
    if program == "nnx_llama":  # tensor parallel: its logical names' 'tp' rules
        make_step, kwargs = module.make_step, {"rule_set": "tp"}
    else:  # the hand-written tensor-parallel specs
        make_step, kwargs = module.make_step_with("tp"), {}
    audit = shardscope.audit_program(make_step, "data=2,model=4", axis_types="auto", **kwargs)
    layers = _by_layer(audit)
    # both layers named apart, by their path from the model called
    assert sorted(layers) == ["0", "1"]
    assert all(c.scope.startswith(f"{root}/") for c in audit.collectives if c.scope)
    # the same layer twice: the same bytes in each, and more than one scope inside
    assert layers["0"] == layers["1"]
    assert len({rest for rest, *_ in layers["0"]}) > 1


def test_the_modules_are_as_they_were_after_the_audit():
    from flax import nnx

    module = program_module("nnx_llama")
    calls: dict[type, Callable] = {
        cls: cls.__dict__["__call__"]
        for cls in (module.Block, module.Decoder, nnx.Linear, nnx.RMSNorm)
    }
    shardscope.audit_program(module.make_step, "data=8", axis_types="auto", rule_set="dp")
    assert all(cls.__dict__["__call__"] is call for cls, call in calls.items())
