"""``torch_npu.testing.testcase``: torch_npu's ``TestCase`` and ``run_tests``.

torch_npu's test files compare npu results with CPU ones through two contracts that
differ from PyTorch's ``TestCase``:

- ``assertEqual(x, y, prec=None, message="")``: tensors (``y`` moved to ``x``'s device and
  dtype), numbers and nested containers are equal when the largest absolute difference is
  at most ``prec`` (the case's ``precision``, 1e-5 by default); NaNs must be at the same
  places, infinities too with ``allow_inf``.
- ``assertRtolEqual(x, y, prec=1e-4, prec16=1e-3)``: per element, the absolute error or
  the error relative to ``max(|x|, |y|)`` must be within ``prec`` (``prec16`` for float16),
  and a result fails only when more than a ``prec`` fraction of the elements misses both;
  bfloat16 pairs are compared with ``allclose(rtol=atol=prec16)``; shapes and dtypes must
  match.

Importing it touches no device.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import unittest
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from numbers import Number
from typing import Any

import expecttest
import numpy as np
import torch
from torch_npu.testing.common_utils import is_iterable, iter_indices, set_npu_device

__all__ = ["TestCase", "run_tests"]

# assertRtolEqual's dtypes, and the offsets that keep its relative error finite at zero.
_RTOL_DTYPES = (np.bool_, np.uint8, np.uint16, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                np.float64)
_FLOAT16_MINIMUM = 6e-8
_MINIMUM = 1e-9


def run_tests() -> None:
    """Runs the calling file's test cases with unittest (``python test_x.py``; pytest collects them too)."""
    unittest.main(argv=sys.argv)


class TestCase(expecttest.TestCase):
    """torch_npu's test case: the class's tests run on ``npu:<SET_NPU_DEVICE>`` (``npu:0``), each
    seeded with ``SEED`` (666) for torch and ``random``."""

    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self) -> float:
        return self._precision

    @precision.setter
    def precision(self, prec: float) -> None:
        self._precision = prec

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.npu_device = set_npu_device()

    def setUp(self) -> None:
        super().setUp()
        seed = int(os.getenv("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)

    # ---- assertRtolEqual ---------------------------------------------------

    def assertRtolEqual(self, x: Any, y: Any, prec: float = 1.0e-4, prec16: float = 1.0e-3,  # noqa: N802
                        auto_trans_dtype: bool = False, message: str | None = None) -> None:
        """See the module docstring."""
        if _is_sequence(x) and _is_sequence(y):
            for x_item, y_item in zip(x, y, strict=False):  # torch_npu compares the common prefix
                self.assertRtolEqual(x_item, y_item, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and _is_sequence(y):
            y = torch.as_tensor(y, dtype=x.dtype, device=x.device)
        elif _is_sequence(x) and isinstance(y, torch.Tensor):
            x = torch.as_tensor(x, dtype=y.dtype, device=y.device)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if auto_trans_dtype:
                x = x.to(y.dtype)
            if x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16:
                if x.shape != y.shape:
                    self.fail(_join(message, f"shape error: {tuple(x.shape)} vs {tuple(y.shape)}"))
                if not torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=prec16, atol=prec16):
                    self.fail(_join(message, f"result error: bfloat16 values differ beyond rtol=atol={prec16}"))
                return
            x, y = x.detach().cpu().numpy(), y.detach().cpu().numpy()
        elif isinstance(x, Number) and isinstance(y, Number):
            x, y = np.array(x), np.array(y)
        if x.shape != y.shape:
            self.fail(_join(message, f"shape error: {x.shape} vs {y.shape}"))
        if x.dtype != y.dtype:
            self.fail(_join(message, f"dtype error: {x.dtype} vs {y.dtype}"))
        if x.dtype not in _RTOL_DTYPES:
            self.fail(_join(message, f"dtype error: assertRtolEqual compares {[d.__name__ for d in _RTOL_DTYPES]}, "
                                     f"got {x.dtype}"))
        if x.dtype == np.bool_:
            if not np.array_equal(x, y):
                self.fail(_join(message, f"result error: {int(np.sum(x != y))} of {x.size} booleans differ"))
        elif x.dtype == np.float16:
            self._compare_rtol(x, y, prec16, _FLOAT16_MINIMUM, message)
        else:
            self._compare_rtol(x, y, prec, _MINIMUM, message)

    def _compare_rtol(self, x: np.ndarray, y: np.ndarray, prec: float, minimum: float, message: str | None) -> None:
        x64, y64 = x.astype(np.float64), y.astype(np.float64)  # no wrap-around of unsigned differences
        nan = np.isnan(x64)
        if not np.array_equal(nan, np.isnan(y64)):
            self.fail(_join(message, "result error: NaNs at different places"))
        error = np.abs(np.where(nan, 0.0, y64 - x64))
        with np.errstate(invalid="ignore"):
            within_atol = error <= prec
            within_rtol = error / (np.maximum(np.abs(x64), np.abs(y64)) + minimum) <= prec
        if within_atol.all() or within_rtol.all():
            return
        missed_rtol, missed_atol = int(np.sum(~within_rtol)), int(np.sum(~within_atol))
        if missed_rtol > x.size * prec and missed_atol > x.size * prec:
            self.fail(_join(message, f"result error: {missed_rtol} of {x.size} elements exceed rtol {prec} and "
                                     f"{missed_atol} exceed atol {prec} (largest absolute error {error.max()})"))

    # ---- assertEqual with an absolute precision ----------------------------

    def assertEqual(self, x: Any, y: Any, prec: float | str | None = None, message: str = "",  # noqa: N802
                    allow_inf: bool = False, exact_dtype: bool | None = None, msg: str | None = None) -> None:
        """See the module docstring; ``assertEqual(x, y, "message")`` is accepted, as torch_npu's."""
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        message = message or msg or ""
        self._assert_equal(x, y, self.precision if prec is None else prec, message, allow_inf,
                           self.exact_dtype if exact_dtype is None else exact_dtype)

    def _assert_equal(self, x: Any, y: Any, prec: float, message: str, allow_inf: bool, exact_dtype: bool) -> None:
        if isinstance(x, Number) or isinstance(y, Number):
            self._assert_number_equal(x, y, prec, message, allow_inf)
        elif isinstance(x, np.bool_) or isinstance(y, np.bool_):
            super().assertEqual(_item(x), _item(y), message)
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self._assert_tensors_equal(x, y, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, (str, bytes)) and isinstance(y, (str, bytes)) or (type(x) is set and type(y) is set):
            super().assertEqual(x, y, message)
        elif isinstance(x, dict) and isinstance(y, dict):
            if isinstance(x, OrderedDict) and isinstance(y, OrderedDict):
                self._assert_equal(list(x.items()), list(y.items()), prec, message, allow_inf, exact_dtype)
            else:
                super().assertEqual(set(x), set(y), message)
                keys = list(x)
                self._assert_equal([x[k] for k in keys], [y[k] for k in keys], prec, message, allow_inf, exact_dtype)
        elif is_iterable(x) and is_iterable(y):
            super().assertEqual(len(x), len(y), message)
            for x_item, y_item in zip(x, y, strict=True):
                self._assert_equal(x_item, y_item, prec, message, allow_inf, exact_dtype)
        else:
            super().assertEqual(x, y, message)

    def _assert_number_equal(self, x: Any, y: Any, prec: float, message: str, allow_inf: bool) -> None:
        x, y = _item(x), _item(y)
        if not isinstance(x, Number) or not isinstance(y, Number):
            super().assertEqual(x, y, message)
            return
        if abs(x) == float("inf") or abs(y) == float("inf"):
            if not allow_inf:
                self.fail(_join(message, f"Expected finite numeric values - x={x}, y={y}"))
            super().assertEqual(x, y, message)
            return
        self.assertLessEqual(abs(x - y), prec, message)

    def _assert_tensors_equal(self, x: torch.Tensor, y: torch.Tensor, prec: float, message: str, allow_inf: bool,
                              exact_dtype: bool) -> None:
        super().assertEqual(x.is_sparse, y.is_sparse, message)
        super().assertEqual(x.is_quantized, y.is_quantized, message)
        if x.is_sparse:
            x, y = self.safeCoalesce(x), self.safeCoalesce(y)
            self._assert_dense_equal(x._indices(), y._indices(), prec, message, allow_inf, exact_dtype)
            self._assert_dense_equal(x._values(), y._values(), prec, message, allow_inf, exact_dtype)
        elif x.is_quantized:
            super().assertEqual(x.qscheme(), y.qscheme(), message)
            super().assertEqual(x.dtype, y.dtype, message)
            self._assert_dense_equal(x.dequantize(), y.dequantize(), prec, message, allow_inf, exact_dtype)
            self._assert_dense_equal(x.int_repr().to(torch.int32), y.int_repr().to(torch.int32), prec, message,
                                     allow_inf, exact_dtype)
        else:
            self._assert_dense_equal(x, y, prec, message, allow_inf, exact_dtype)

    def _assert_dense_equal(self, a: torch.Tensor, b: torch.Tensor, prec: float, message: str, allow_inf: bool,
                            exact_dtype: bool) -> None:
        super().assertEqual(a.size(), b.size(), message)
        if exact_dtype:
            super().assertEqual(a.dtype, b.dtype, message)
        if a.numel() == 0:
            return
        if (a.dtype == torch.bool) != (b.dtype == torch.bool):
            raise TypeError(f"assertEqual: expected both tensors to be bool, got {a.dtype} and {b.dtype}")
        if a.device.type == "cpu" and a.dtype in (torch.float16, torch.bfloat16):
            a = a.to(torch.float32)  # CPU half tensors lack some of the operations below
        b = b.to(a)
        if not (a.dtype.is_floating_point or a.dtype.is_complex):
            a, b = a.to(torch.int64), b.to(torch.int64)  # no wrap-around of unsigned or bool differences
        diff = a - b
        if a.dtype.is_floating_point or a.dtype.is_complex:
            nan = torch.isnan(a)
            self.assertTrue(torch.equal(nan, torch.isnan(b)), _join(message, "NaNs at different places"))
            diff[nan] = 0
            if allow_inf:
                inf = torch.isinf(a)
                self.assertTrue(torch.equal(inf.sign(), torch.isinf(b).sign()), _join(message, "infinities differ"))
                diff[inf] = 0
        diff = diff.abs()
        if diff.is_complex():
            diff = diff.real
        self.assertLessEqual(diff.max().item(), prec, message)

    def assertAlmostEqual(self, x: Any, y: Any, places: int | None = None, msg: str | None = None,  # noqa: N802
                          delta: float | None = None, allow_inf: bool = False) -> None:
        prec = 10 ** (-places) if places else delta
        self.assertEqual(x, y, prec, msg or "", allow_inf)

    def assertNotEqual(self, x: Any, y: Any, prec: float | str | None = None, message: str = "") -> None:  # noqa: N802
        if isinstance(prec, str) and not message:
            message, prec = prec, None
        prec = self.precision if prec is None else prec
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.size() != y.size():
                return
            self.assertGreater(x.numel(), 0)
            y = y.type_as(x)
            nan = x != x
            if torch.equal(nan, y != y):
                if x.dtype == torch.bool:
                    x, y = x.to(torch.int), y.to(torch.int)
                diff = (x - y).abs() if (x - y).is_signed() else x - y
                diff[nan] = 0
                self.assertGreaterEqual(diff.max().item(), prec, message)
        elif isinstance(x, str) and isinstance(y, str) or (is_iterable(x) and is_iterable(y)):
            super().assertNotEqual(x, y)
        else:
            try:
                self.assertGreaterEqual(abs(x - y), prec, message)
                return
            except (TypeError, AssertionError):
                pass
            super().assertNotEqual(x, y, message)

    def assertTensorsSlowEqual(self, x: torch.Tensor, y: torch.Tensor, prec: float | None = None,  # noqa: N802
                               message: str = "") -> None:
        """Element by element: the largest absolute difference is at most ``prec`` (bools: equal)."""
        super().assertEqual(x.size(), y.size())
        super().assertEqual(x.dtype, y.dtype)
        y = y.type_as(x)
        if x.dtype == torch.bool:
            self.assertTrue(torch.equal(x.cpu(), y.cpu()), message)
            return
        largest = max((abs(x[i] - y[i]) for i in iter_indices(x)), default=0)
        self.assertLessEqual(largest, self.precision if prec is None else prec, message)

    # ---- sparse tensors ----------------------------------------------------

    def genSparseTensor(self, size: Sequence[int], sparse_dim: int, nnz: int, is_uncoalesced: bool,  # noqa: N802
                        device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A random sparse COO tensor (duplicated entries when ``is_uncoalesced``), its indices and values."""
        if nnz > 0 and not all(size[d] > 0 for d in range(sparse_dim)):
            raise RuntimeError(f"genSparseTensor: nnz={nnz} entries cannot fit sparse dims of size {size[:sparse_dim]}")
        values = torch.randn(nnz, *size[sparse_dim:], device=device)
        indices = torch.rand(sparse_dim, nnz, device=device)
        indices.mul_(torch.tensor(size[:sparse_dim]).unsqueeze(1).to(indices))
        indices = indices.to(torch.long)
        if is_uncoalesced:
            values = torch.cat([values, torch.randn_like(values)], 0)
            indices = torch.cat([indices, indices], 1)
        tensor = torch.sparse_coo_tensor(indices, values, torch.Size(size))
        tensor = tensor.detach().clone() if is_uncoalesced else tensor.coalesce()
        return tensor, tensor._indices().clone(), tensor._values().clone()

    def safeToDense(self, t: torch.Tensor) -> torch.Tensor:  # noqa: N802
        return self.safeCoalesce(t).to_dense()

    def safeCoalesce(self, t: torch.Tensor) -> torch.Tensor:  # noqa: N802
        """``t.coalesce()``, checked: the same dense values, and coalesced."""
        coalesced = t.coalesce()
        torch.testing.assert_close(coalesced.to_dense(), t.to_dense())
        self.assertTrue(coalesced.is_coalesced())
        return coalesced

    # ---- other helpers -----------------------------------------------------

    def assertObjectIn(self, obj: object, iterable: Any) -> None:  # noqa: N802
        if not any(item is obj for item in iterable):
            raise AssertionError("object not found in iterable")

    def assertExpectedRaises(self, exc_type: type[BaseException], call_fn: Callable[..., Any], *args: Any,  # noqa: N802
                             **kwargs: Any) -> None:
        subname = kwargs.pop("subname", None)
        try:
            call_fn(*args, **kwargs)
        except exc_type as exc:
            self.assertExpected(str(exc), subname)
            return
        self.fail(msg="Did not raise when expected to")

    def assertNotWarn(self, call_fn: Callable[[], Any], msg: str = "") -> None:  # noqa: N802
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call_fn()
        self.assertTrue(len(caught) == 0, msg)

    def assertWarns(self, call_fn: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        """torch_npu's ``assertWarns(call_fn, msg="")`` (``call_fn`` warns); given a warning class, unittest's."""
        if isinstance(call_fn, type) and issubclass(call_fn, Warning):
            return super().assertWarns(call_fn, *args, **kwargs)
        msg = args[0] if args else kwargs.get("msg", "")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call_fn()
        self.assertTrue(len(caught) > 0, msg)
        return None

    @contextlib.contextmanager
    def maybeWarnsRegex(self, category: type[Warning], regex: str = "") -> Iterator[None]:  # noqa: N802
        """The block may warn ``category`` matching ``regex``; any other warning fails the test."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=regex, category=category)
            try:
                yield
            finally:
                if caught:
                    self.fail("Caught unexpected warnings:\n" + "".join(
                        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught))

    def assertExpectedStripMangled(self, s: str, subname: str | None = None) -> None:  # noqa: N802
        self.assertExpected(re.sub(r"__torch__[^ ]+", "", s), subname)


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _item(value: Any) -> Any:
    return value.item() if isinstance(value, (torch.Tensor, np.generic)) else value


def _join(message: str | None, detail: str) -> str:
    return f"{message}: {detail}" if message else detail
