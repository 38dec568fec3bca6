"""A user's network: `--policy package.module:callable` and its options, as master and workers
both read them, and the genome contract for an arbitrary torch module.

The callable is a factory: `factory(observation_space, action_space, **options)` returns a
torch `nn.Module`. The genome's vector is the module's parameters in `named_parameters()`
order (the order the module defines them), each flattened row-major as torch stores it; its
buffers (a batch norm's running statistics, say) stay as the factory made them. The module is
fed float32 observations of shape (batch, *observation_shape) as the env gives them (pixels
0-255 unscaled; ES's normaliser first where the run has one) and returns (batch, outputs): one
output per action for a Discrete space (the action is the argmax), one per action dimension
for a Box (squashed into its bounds by tanh), as the built-in networks' heads do.

Initialisation from the genome's first seed, as for the built-in networks (neuro/decode.py):
theta_0 = noise * init_scale, where init_scale is, per parameter,

- a parameter of two or more dimensions (a weight): std / sqrt(fan_in), fan_in the product of
  its dimensions after the first (a linear layer's inputs, a convolution's in_channels x kernel
  area); std is OUTPUT_STD (0.1) for the last such parameter, by convention the output layer,
  and HIDDEN_STD (1.0) for the others;
- any other parameter (a bias, a norm's scale): 0, so it starts at zero and mutations move it.

On the paper's and the mlp's layouts this is neuro.layout.init_scale exactly.

Nothing here imports torch: the master builds a user's module once (master/run/
algorithm_setup.py) with the user's own import of torch, and reads its parameters' names and
shapes only.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from neuro.inference import MODULE_ARCHITECTURE
from neuro.layout import HIDDEN_STD, MAX_PARAMS, OUTPUT_STD, Layout, init_scale

__all__ = [
    "MAX_FACTORY_LENGTH",
    "MAX_OPTIONS_CHARS",
    "ModuleUnavailable",
    "UserPolicy",
    "import_named",
    "init_scale_of",
    "is_factory",
    "load_factory",
    "make_module",
    "module_init_scale",
    "module_layout",
    "user_policy",
]

MAX_FACTORY_LENGTH = 256
"""Characters of `package.module:callable`: far more than any real path, few enough for a task."""
MAX_OPTIONS_CHARS = 4096
"""Characters of the options' JSON, which every task carries."""
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_FACTORY = re.compile(rf"(?P<module>{_DOTTED}):(?P<attribute>{_DOTTED})")
_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ModuleUnavailable(ValueError):
    """A module a run needs (its env's or its policy's) cannot be imported here, or lacks what
    the run names in it: no task of the run can run here."""

    def __init__(self, module: str, what: str, why: str) -> None:
        super().__init__(f"cannot import module {module!r} ({what}): {why}")
        self.module = module
        self.what = what


def is_factory(text: str) -> bool:
    """Whether `text` names a factory (`package.module:callable`) rather than a built-in net."""
    return ":" in text


def _check_factory(factory: str) -> str:
    if not isinstance(factory, str) or len(factory) > MAX_FACTORY_LENGTH:
        shown = factory[:80] if isinstance(factory, str) else factory
        raise ValueError(
            f"a policy factory is at most {MAX_FACTORY_LENGTH} characters, got {shown!r}"
        )
    if _FACTORY.fullmatch(factory) is None:
        raise ValueError(
            f"a policy factory looks like package.module:callable (Python names), got {factory!r}"
        )
    return factory


def _canonical_options(options: Mapping[str, Any]) -> str:
    """The options as canonical JSON (sorted keys, no spaces); ValueError naming what is wrong."""
    if not isinstance(options, Mapping):
        raise ValueError(f"policy options must be a JSON object, got {options!r}"[:200])
    for key in options:
        if not isinstance(key, str) or _KEYWORD.fullmatch(key) is None:
            raise ValueError(
                f"policy option names are Python names (keyword arguments), got {key!r}"
            )
    try:
        text = json.dumps(dict(options), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"policy options must be JSON values: {error}") from None
    if len(text) > MAX_OPTIONS_CHARS:
        raise ValueError(
            f"policy options take {len(text)} characters of JSON, more than {MAX_OPTIONS_CHARS}"
        )
    return text


@dataclass(frozen=True)
class UserPolicy:
    """A user's network: its factory and the options it is called with (canonical JSON, so
    equal options are equal specs). Make one with user_policy(), which checks both."""

    factory: str
    """package.module:callable."""
    options_json: str = "{}"

    def __post_init__(self) -> None:
        _check_factory(self.factory)
        try:
            options = json.loads(self.options_json)
        except (TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"policy options are not JSON: {error}") from None
        object.__setattr__(self, "options_json", _canonical_options(options))

    @property
    def module(self) -> str:
        """The module to import: `package.module`."""
        return self.factory.partition(":")[0]

    @property
    def attribute(self) -> str:
        """The callable's (dotted) name within the module."""
        return self.factory.partition(":")[2]

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments the factory is called with (a fresh dict each time)."""
        return json.loads(self.options_json)

    def describe(self) -> str:
        """The factory and its options as a log line shows them."""
        return self.factory if self.options_json == "{}" else f"{self.factory} {self.options_json}"


def user_policy(factory: str, options: Mapping[str, Any] | None = None) -> UserPolicy:
    """A checked UserPolicy; ValueError naming the factory or option at fault."""
    return UserPolicy(factory, _canonical_options(options or {}))


def import_named(module: str, what: str) -> ModuleType:
    """`module`, imported; ModuleUnavailable naming it (and `what` needs it) if it cannot be."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # a missing package, or one that fails at import: either way
        raise ModuleUnavailable(module, what, f"{type(error).__name__}: {error}") from error


def load_factory(policy: UserPolicy) -> Callable[..., Any]:
    """The policy's factory, imported; ModuleUnavailable naming the module if it cannot be
    imported or does not hold the callable (another version of the package)."""
    what = f"policy {policy.factory}"
    found: Any = import_named(policy.module, what)
    for name in policy.attribute.split("."):
        if not hasattr(found, name):
            raise ModuleUnavailable(
                policy.module, what, f"it has no {policy.attribute!r} (another version?)"
            )
        found = getattr(found, name)
    if not callable(found):
        raise ValueError(
            f"policy factory {policy.factory} is a {type(found).__name__}, not callable"
        )
    return found


def make_module(policy: UserPolicy, observation_space: Any, action_space: Any) -> Any:
    """The factory's module for these spaces (an nn.Module, duck-typed: no torch here);
    ModuleUnavailable if it cannot be imported, ValueError naming the factory if it fails or
    returns something else."""
    factory = load_factory(policy)
    try:
        module = factory(observation_space, action_space, **policy.options)
    except Exception as error:  # the user's code: any failure is named, never a crash
        raise ValueError(
            f"policy factory {policy.describe()} failed: {type(error).__name__}: {error}"
        ) from error
    if not callable(getattr(module, "named_parameters", None)):
        raise ValueError(
            f"policy factory {policy.factory} returned a {type(module).__name__}, not a torch "
            "nn.Module"
        )
    return module


def module_layout(module: Any, name: str = "the policy") -> Layout:
    """(name, shape) of every parameter of a module, in named_parameters() order: the genome's
    layout. ValueError naming `name` where it has none, one that is not float32, or more than
    MAX_PARAMS."""
    layout: Layout = []
    for parameter_name, parameter in module.named_parameters():
        dtype = str(parameter.dtype)
        if dtype != "torch.float32":
            raise ValueError(
                f"{name}'s parameter {parameter_name!r} is {dtype}; a genome decodes to "
                "float32 parameters only"
            )
        layout.append((parameter_name, tuple(int(size) for size in parameter.shape)))
    if not layout:
        raise ValueError(f"{name} has no parameters: there is nothing to evolve")
    count = sum(math.prod(shape) for _, shape in layout)
    if count > MAX_PARAMS:
        raise ValueError(f"{name} has {count} parameters, more than the limit of {MAX_PARAMS}")
    return layout


def module_init_scale(layout: Layout) -> np.ndarray:
    """Per-parameter init scale of a user's module (the rule in this module's docstring)."""
    weights = [i for i, (_, shape) in enumerate(layout) if len(shape) >= 2]
    output = weights[-1] if weights else -1
    parts = []
    for i, (_, shape) in enumerate(layout):
        n = math.prod(shape)
        if len(shape) >= 2:
            std = OUTPUT_STD if i == output else HIDDEN_STD
            value = np.float32(std / math.sqrt(math.prod(shape[1:])))
            parts.append(np.full(n, value, np.float32))
        else:
            parts.append(np.zeros(n, np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def init_scale_of(architecture: str, layout: Layout) -> np.ndarray:
    """The init scale of a network of this architecture and layout: a user's module's rule,
    or the built-in networks' (neuro.layout.init_scale)."""
    if architecture == MODULE_ARCHITECTURE:
        return module_init_scale(layout)
    return init_scale(layout)
