"""npusim's torch_npu: an importable package, fused operators through npusim.ops.fused.OPS, absent names
absent to hasattr, and the names frameworks touch (runtime/parity.py) provided or refused."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from npusim.compat import torch_npu as shim
from npusim.ops.fused import OPS
from npusim.runtime.parity import FRAMEWORK_PROVIDED, FRAMEWORK_REFUSED


@pytest.fixture
def torch_npu() -> Iterator[object]:
    module = shim.install()
    try:
        yield module
    finally:
        shim.uninstall()


def _resolve(path: str) -> object:
    """Imports the longest module prefix of ``path`` that is a module, then reads the remaining attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            value = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if isinstance(err, shim.NotSimulatedModuleError) or not name.startswith(err.name or "?") or cut == 1:
                raise
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise AssertionError("unreachable")


def test_import_machinery_sees_an_installed_package(torch_npu):
    """find_spec, import_module and pkgutil see a package with a real spec, loader, file and __path__."""
    spec = importlib.util.find_spec("torch_npu")
    assert spec is torch_npu.__spec__ and spec.origin == torch_npu.__file__ and spec.has_location
    assert spec.loader.get_filename("torch_npu") == str(shim.PACKAGE_DIR / "__init__.py")
    assert torch_npu.__path__ == [str(shim.PACKAGE_DIR)] and torch_npu.__version__ == "2.13.0"
    assert importlib.util.find_spec("torch_npu.testing.testcase").origin.endswith("testing/testcase.py")
    common_utils = importlib.import_module("torch_npu.testing.common_utils")
    assert common_utils.__name__ == "torch_npu.testing.common_utils"
    assert {"_C", "testing", "utils", "contrib", "_inductor", "version"} <= {
        m.name for m in pkgutil.iter_modules(torch_npu.__path__)}
    assert torch_npu.npu is torch.npu and sys.modules["torch_npu.npu.amp"] is torch.npu.amp
    assert importlib.util.find_spec("torch_npu.npu.utils") is torch.npu.utils.__spec__


def test_nothing_is_left_after_uninstall():
    """Outside npusim run no torch_npu is findable, and the children's startup path goes with the module."""
    before = os.environ.get("PYTHONPATH")
    assert importlib.util.find_spec("torch_npu") is None
    shim.install()
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(shim.STARTUP_DIR)
    shim.uninstall()
    assert os.environ.get("PYTHONPATH") == before
    assert "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None


def test_fused_operator_resolves_through_ops_at_access(torch_npu, monkeypatch):
    """torch_npu.<op> is OPS[op] when registered (read at each access); else hasattr is False, the error names it."""
    name = "npu_rms_norm"
    monkeypatch.delitem(OPS, name, raising=False)
    assert not hasattr(torch_npu, name)
    with pytest.raises(shim.NotSimulatedError, match=r"torch_npu\.npu_rms_norm is not simulated by npusim") as info:
        torch_npu.npu_rms_norm  # noqa: B018
    assert isinstance(info.value, AttributeError) and info.value.name == name
    with pytest.raises(ImportError, match="npu_rms_norm"):
        exec("from torch_npu import npu_rms_norm", {})

    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    monkeypatch.setitem(OPS, name, scale)  # an operator that merges later appears without editing the module
    assert hasattr(torch_npu, name) and torch_npu.npu_rms_norm is scale and name in dir(torch_npu)
    assert torch.equal(torch_npu.npu_rms_norm(torch.ones(2, device="npu"), 3.0).cpu(), torch.full((2,), 3.0))


def test_unknown_names_and_unsimulated_submodules_are_refused_by_name(torch_npu):
    """Any other attribute is a NotSimulatedError; torch_npu's services fail to import naming themselves."""
    with pytest.raises(AttributeError, match=r"torch_npu\.erase_stream is not simulated by npusim"):
        torch_npu.erase_stream  # noqa: B018
    with pytest.raises(shim.NotSimulatedModuleError, match=r"torch_npu\.profiler is not simulated by npusim"):
        import torch_npu.profiler  # noqa: F401
    assert importlib.util.find_spec("torch_npu.optim") is not None  # found, so the error can name it
    with pytest.raises(ModuleNotFoundError, match="fused optimizers"):
        importlib.import_module("torch_npu.optim")
    with pytest.raises(AttributeError, match=r"torch_npu\._C\._npu_getDeviceUtilizationRate is not simulated"):
        torch_npu._C._npu_getDeviceUtilizationRate  # noqa: B018


@pytest.mark.parametrize("path", sorted(FRAMEWORK_PROVIDED))
def test_framework_name_is_provided(torch_npu, path):
    """Each name frameworks touch that runtime/parity.py lists as provided resolves under npusim run."""
    assert len(FRAMEWORK_PROVIDED[path]) > 10
    assert _resolve(path) is not None


@pytest.mark.parametrize("path", sorted(FRAMEWORK_REFUSED))
def test_framework_name_is_refused_by_name(torch_npu, path):
    """Each name listed as refused raises an import or attribute error naming it."""
    assert len(FRAMEWORK_REFUSED[path]) > 20
    with pytest.raises((ImportError, AttributeError)) as info:
        _resolve(path)
    assert path.rsplit(".", 1)[-1] in str(info.value)


@pytest.mark.asynchronous
def test_raw_stream_and_sleep_entry_points(torch_npu):
    """_npu_getCurrentRawStream is the current stream's id; _npu_sleep holds that stream."""
    stream = torch.npu.Stream(device=1)
    with torch.npu.stream(stream):
        assert torch_npu._C._npu_getCurrentRawStream(1) == stream.stream_id
        torch_npu._C._npu_sleep(1_800_000)  # 1 ms at the profile's 1800 MHz
        assert stream.pending() == 1
    stream.synchronize()
    assert stream.pending() == 0 and torch_npu._C._npu_getCurrentRawStream(1) == torch.npu.current_stream(1).stream_id


def test_hccl_options_checked_and_filled_by_the_backend(torch_npu, tmp_path):
    """ProcessGroupHCCL.Options reaches the hccl backend: a bad hccl_config type is refused, a good one fills in."""
    options_cls = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options
    assert issubclass(options_cls, torch._C._distributed_c10d.Backend.Options)
    options = options_cls()
    config = options.hccl_config
    config["hccl_buffer_size"] = 200
    assert options.hccl_config == {}  # a copy, as torch_npu's binding returns
    options.hccl_config = {**config, "group_name": "ep", "unknown_key": 1.5}
    dist.init_process_group("hccl", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1,
                            device_id=torch.device("npu", 0))
    try:
        group = dist.new_group([0], pg_options=options, timeout=timedelta(seconds=77))
        backend = group._get_backend(torch.device("npu"))
        assert isinstance(backend, torch_npu._C._distributed_c10d.ProcessGroupHCCL)
        assert options._timeout == timedelta(seconds=77) and options.global_ranks_in_group == [0]
        tensor = torch.ones(3, device="npu")
        dist.all_reduce(tensor, group=group)
        assert torch.equal(tensor.cpu(), torch.ones(3))
        bad = options_cls()
        bad.hccl_config = {"hccl_buffer_size": "200"}
        with pytest.raises(TypeError, match=r"hccl_config\['hccl_buffer_size'\] must be int, got str"):
            dist.new_group([0], pg_options=bad)
    finally:
        dist.destroy_process_group()


def test_inductor_module_registers_npusims_backend(torch_npu):
    """Importing torch_npu._inductor imports inductor, which registers npusim's npu backend."""
    import torch_npu._inductor  # noqa: F401
    from torch._inductor.codegen.common import get_wrapper_codegen_for_device

    assert get_wrapper_codegen_for_device("npu").__name__ == "NpuPythonWrapperCodegen"
    with pytest.raises(AttributeError, match=r"torch_npu\._inductor\.lowering_op_list is not simulated"):
        torch_npu._inductor.lowering_op_list  # noqa: B018
