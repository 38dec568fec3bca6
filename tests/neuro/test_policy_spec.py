"""A user's network as both sides read it: the factory path and options, the module that cannot
be imported (named), and the init rule of an arbitrary module's parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from neuro.inference import (
    ARCHITECTURES,
    MODULE_ARCHITECTURE,
    PER_GENOME,
    check_combination,
    default_dtype,
)
from neuro.layout import HIDDEN_STD, OUTPUT_STD, init_scale, parameter_layout
from neuro.policy_spec import (
    MAX_FACTORY_LENGTH,
    MAX_OPTIONS_CHARS,
    ModuleUnavailable,
    UserPolicy,
    init_scale_of,
    is_factory,
    load_factory,
    module_init_scale,
    user_policy,
)


def test_a_factory_names_a_module_and_a_callable() -> None:
    policy = user_policy("mypkg.nets:make_policy", {"hidden": 32, "act": "tanh"})
    assert (policy.module, policy.attribute) == ("mypkg.nets", "make_policy")
    assert policy.options == {"act": "tanh", "hidden": 32}
    # Canonical: the same options in another order are the same spec (a cache key, a task).
    assert policy == user_policy("mypkg.nets:make_policy", {"act": "tanh", "hidden": 32})
    assert policy.options_json == '{"act":"tanh","hidden":32}'
    assert UserPolicy("a:b", ' { "x" : 1 } ') == user_policy("a:b", {"x": 1})
    assert is_factory("mypkg.nets:make_policy") and not is_factory("mlp")


@pytest.mark.parametrize(
    "factory",
    ["mypkg.nets", "mypkg.nets:", ":make", "my-pkg:make", "a:b:c", "1pkg:make", "a :b",
     "a" * MAX_FACTORY_LENGTH + ":b"],
)  # fmt: skip
def test_a_factory_that_is_no_python_path_is_refused_by_name(factory: str) -> None:
    with pytest.raises(ValueError, match="policy factory") as caught:
        user_policy(factory)
    assert factory[:40] in str(caught.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"not a name": 1}, "'not a name'"),
        ({"x": float("nan")}, "JSON values"),
        ({"x": object()}, "JSON values"),
        ({"x": "y" * MAX_OPTIONS_CHARS}, f"more than {MAX_OPTIONS_CHARS}"),
    ],
)
def test_options_that_cannot_travel_are_refused_by_name(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        user_policy("a:b", options)


def test_a_module_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ModuleUnavailable) as caught:
        load_factory(user_policy("no_such_package_here.nets:make"))
    error = caught.value
    assert error.module == "no_such_package_here.nets"
    assert "cannot import module 'no_such_package_here.nets'" in str(error)
    assert "policy no_such_package_here.nets:make" in str(error)
    assert isinstance(error, ValueError)


def test_a_module_without_the_callable_is_named_as_unavailable() -> None:
    with pytest.raises(ModuleUnavailable, match="has no 'no_such_factory'"):
        load_factory(user_policy("json:no_such_factory"))
    with pytest.raises(ValueError, match="not callable"):
        load_factory(user_policy("json:__name__"))
    assert load_factory(user_policy("json.decoder:JSONDecoder.decode")) is not None


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("outputs", [1, 18])
def test_the_module_rule_is_the_built_in_rule_on_the_built_in_layouts(
    architecture: str, outputs: int
) -> None:
    shape = (4, 84, 84) if architecture != "mlp" else (7,)
    layout = parameter_layout(architecture, shape, outputs)
    assert module_init_scale(layout).tobytes() == init_scale(layout).tobytes()


def test_the_module_rule_on_layers_of_any_name() -> None:
    # A conv, a layer norm's scale, a weight with a bias of another name, the output layer.
    layout = [("features.0.weight", (4, 1, 3, 3)), ("features.0.bias", (4,)),
              ("norm.weight", (36,)), ("head.w", (2, 36)), ("head.b", (2,))]  # fmt: skip
    scale = module_init_scale(layout)
    assert scale.dtype == np.float32 and scale.size == 36 + 4 + 36 + 72 + 2
    np.testing.assert_array_equal(scale[:36], np.float32(HIDDEN_STD / 3.0))
    np.testing.assert_array_equal(scale[36:76], 0.0)  # the bias and the norm's scale
    np.testing.assert_array_equal(scale[76:148], np.float32(OUTPUT_STD / math.sqrt(36)))
    np.testing.assert_array_equal(scale[148:], 0.0)
    assert init_scale_of(MODULE_ARCHITECTURE, layout).tobytes() == scale.tobytes()
    assert init_scale_of("mlp", layout).tobytes() != scale.tobytes()  # names decide there


def test_a_user_module_runs_float32_on_the_per_genome_runner_only() -> None:
    check_combination("float32", MODULE_ARCHITECTURE, PER_GENOME, "cpu")
    assert default_dtype(MODULE_ARCHITECTURE, PER_GENOME) == "float32"
    for dtype in ("bfloat16", "int8", "int8-static"):
        with pytest.raises(ValueError, match=f"'{dtype}'.*'module'"):
            check_combination(dtype, MODULE_ARCHITECTURE)
    with pytest.raises(ValueError, match="does not run on the batched runner"):
        check_combination("float32", MODULE_ARCHITECTURE, "batched")
