"""``torch_npu.testing.decorator``: dtype / format parametrisation of torch_npu's test methods.

``@Dtypes(torch.float16, torch.float32)`` and ``@Formats(0, 3)`` mark a test method;
``@instantiate_tests`` on the class replaces each marked method by one test per
combination (``test_add_float16_0``, ...), passing the value to the argument whose name
contains ``dtype`` / ``format``, and ``device="npu"`` when the method takes ``device``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Dtypes", "Formats", "instantiate_tests"]


class Dtypes:
    def __init__(self, *dtypes: torch.dtype) -> None:
        if not dtypes:
            raise RuntimeError("Dtypes: no dtypes given")
        if not all(isinstance(dtype, torch.dtype) for dtype in dtypes):
            raise RuntimeError(f"Dtypes: expected torch dtypes, got {dtypes}")
        self.args = dtypes

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.dtypes = self.args  # type: ignore[attr-defined]
        return fn


class Formats:
    def __init__(self, *formats: int) -> None:
        if not formats:
            raise RuntimeError("Formats: no formats given")
        self.args = formats

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.formats = self.args  # type: ignore[attr-defined]
        return fn


def _bind(func: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def test(self: Any) -> Any:
        return func(self, **kwargs)

    test.__name__ = name
    test.__qualname__ = f"{func.__qualname__.rsplit('.', 1)[0]}.{name}"
    return test


def instantiate_tests(cls: type) -> type:
    """See the module docstring."""
    for name, func in list(vars(cls).items()):
        axes = {key: getattr(func, attr) for key, attr in (("dtype", "dtypes"), ("format", "formats"))
                if hasattr(func, attr)}
        if not axes:
            continue
        params = inspect.getfullargspec(func).args
        for values in itertools.product(*axes.values()):
            kwargs: dict[str, Any] = {"device": "npu"} if "device" in params else {}
            test_name = name
            for key, value in zip(axes, values, strict=True):
                matches = [param for param in params if key in param]
                if len(matches) != 1:
                    raise RuntimeError(f"instantiate_tests: {name} needs one argument named like {key!r}, "
                                       f"has {matches}")
                kwargs[matches[0]] = value
                test_name += f"_{str(value).split('.')[-1]}" if key == "dtype" else f"_{value}"
            setattr(cls, test_name, _bind(func, test_name, kwargs))
        delattr(cls, name)
    return cls
