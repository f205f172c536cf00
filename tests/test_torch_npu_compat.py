"""npusim's torch_npu: an importable package, fused operators through npusim.ops.fused.OPS, torch_npu.__all__ and
the submodules' public names by test_public_bindings' rule, absent names absent to hasattr, and the names
frameworks touch (runtime/parity.py) provided or refused."""

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


def test_all_names_the_operators_torch_npu_exposes_that_npusim_has(torch_npu):
    """torch_npu.__all__ is the exposed operators (op-plugin's exposed: for torch 2.13) npusim defines, each
    torch.ops.npu's; what is not in it does not look public by the rule of torch_npu's test_public_bindings
    (test_correct_module_names): a name starting with _, or a __module__ outside torch_npu or inside a private
    part of it."""
    from npusim.runtime.parity import TORCH_NPU_EXPOSED_OPS

    assert torch_npu.__all__ == sorted(TORCH_NPU_EXPOSED_OPS & set(OPS))
    assert {"npu_rms_norm", "npu_fusion_attention", "npu_format_cast", "fast_gelu"} <= set(torch_npu.__all__)
    # Defined but not exposed: backward ops, get_npu_format, and npu_fused_infer_attention_score (exposed for v2.1).
    assert not {"npu_rms_norm_backward", "get_npu_format", "get_storage_size",
                "npu_fused_infer_attention_score"} & set(torch_npu.__all__)
    assert all(getattr(torch_npu, name) is getattr(torch.ops.npu, name) for name in torch_npu.__all__)

    def looks_public(name: str) -> bool:
        module = getattr(getattr(torch_npu, name), "__module__", None) or ""
        return not name.startswith("_") and module.startswith("torch_npu") and "._" not in module

    unexposed = [name for name in dir(torch_npu) if name not in torch_npu.__all__ and looks_public(name)]
    assert unexposed == []


# Names torch_npu's test/allowlist_for_publicAPI.json exempts from the rule, which npusim's have too.
_PUBLIC_API_ALLOWLIST = frozenset({"torch_npu.profiler._ExperimentalConfig",
                                   "torch_npu.profiler.experimental_config._ExperimentalConfig",
                                   "torch_npu.utils.get_cann_version"})


def test_submodules_public_names_follow_test_public_bindings_rule(torch_npu):
    """Every importable torch_npu submodule passes test_public_bindings' test_correct_module_names rule: a
    function, class or dtype is public (in __all__, or not _-named where there is no __all__) exactly when it
    looks public (not _-named, its __module__ inside that module and in no private part). The exceptions are
    torch_npu's own: the exposed operators of torch_npu.__all__ are torch.ops.npu's (op-plugin's allowlist), and
    _PUBLIC_API_ALLOWLIST."""
    import inspect
    from collections.abc import Callable

    mismatched = []
    names = ["torch_npu"] + [m.name for m in pkgutil.walk_packages(torch_npu.__path__, "torch_npu.")]
    for modname in names:
        if any(part.startswith("_") for part in modname.split(".")[1:]) or ".ge_concrete_graph" in modname:
            continue  # private modules, and torchair's GE converters (the test skips them), are not checked
        try:
            module = importlib.import_module(modname)
        except Exception:  # noqa: BLE001  (test_modules_can_be_imported's business, not this rule's)
            continue
        public_names = getattr(module, "__all__", None)
        for elem in dir(module):
            obj = getattr(module, elem)
            if not (isinstance(obj, Callable | torch.dtype) or inspect.isclass(obj)):
                continue
            origin = getattr(obj, "__module__", None) or ""
            looks = not elem.startswith("_") and origin.startswith(modname) and "._" not in origin
            public = elem in public_names if public_names is not None else not elem.startswith("_")
            exempt = f"{modname}.{elem}" in _PUBLIC_API_ALLOWLIST or (modname == "torch_npu"
                                                                     and origin == "torch._ops.npu")
            if public != looks and not exempt:
                mismatched.append(f"{modname}.{elem} (public {public}, __module__ {origin})")
    assert mismatched == [], "\n".join(mismatched)


def test_unknown_names_and_unsimulated_submodules_are_refused_by_name(torch_npu):
    """Any other attribute is a NotSimulatedError; torch_npu's services fail to import naming themselves."""
    with pytest.raises(AttributeError, match=r"torch_npu\.erase_stream is not simulated by npusim"):
        torch_npu.erase_stream  # noqa: B018
    with pytest.raises(shim.NotSimulatedModuleError, match=r"torch_npu\.asd is not simulated by npusim"):
        import torch_npu.asd  # noqa: F401
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


def test_c_entry_points_of_torch_npus_test_files(torch_npu):
    """torch_npu._C's raw stream without a wait, SoC number, strided allocation and graph-tree allocator queries."""
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        assert torch_npu._C._npu_getCurrentRawStreamNoWait(0) == side.npu_stream == side.stream_id
    assert torch.npu.get_device_name(0) == "Ascend910B2" and torch_npu._C._npu_get_soc_version() == 221
    from torch_npu.npu import utils  # torch_npu's test_allocator_envs asks the SoC this way

    assert utils.get_soc_version() == torch.npu.utils.get_soc_version() == 221
    with torch.npu.device(2):
        t = torch_npu._C._empty_strided_npu((2, 3), (1, 2), torch.bfloat16)
    assert (t.device, t.shape, t.stride(), t.dtype) == (torch.device("npu", 2), (2, 3), (1, 2), torch.bfloat16)
    with pytest.raises(TypeError, match="expects exactly 3 args: \\(sizes, strides, dtype\\), got 2"):
        torch_npu._C._empty_strided_npu((2,), (1,))
    with pytest.raises(TypeError, match="arg 3 must be a torch.dtype, got str"):
        torch_npu._C._empty_strided_npu((2,), (1,), "float32")
    with pytest.raises(ValueError, match="on npu:0: sizes and strides must have one entry per dimension, got 2 "
                                         "sizes and 1 strides"):
        torch_npu._C._empty_strided_npu((2, 3), (1,), torch.float32)
    assert torch_npu._C._npu_isHistoryEnabled() is False
    pool = torch.npu.MemPool()
    with torch.npu.use_mem_pool(pool):
        x = torch.empty(100, device="npu")
    assert torch_npu._C._npu_checkPoolLiveAllocations(0, pool.id, {x.data_ptr()}) is True
    assert torch_npu._C._npu_checkPoolLiveAllocations(0, pool.id, set()) is False
    with pytest.raises(RuntimeError, match=r"private pool \(0, \d+\) does not exist on npu:0"):
        torch_npu._C._npu_checkPoolLiveAllocations(0, torch.npu.graph_pool_handle(), set())



def test_weak_ref_tensor_aliases_without_keeping_memory(torch_npu):
    """_C._weak_ref_tensor views the same memory (a write shows through; sizes, strides, offset and the npu format
    kept) without holding it: freeing the original returns its bytes while the weak tensor lives."""
    base = torch.arange(24.0, device="npu").reshape(4, 6)
    view = base[1:, ::2]
    weak = torch_npu._C._weak_ref_tensor(view)
    assert (weak.data_ptr(), weak.shape, weak.stride(), weak.storage_offset()) == (
        view.data_ptr(), view.shape, view.stride(), view.storage_offset())
    base.fill_(7.0)
    assert weak.sum().item() == 7.0 * 9
    cast = torch_npu.npu_format_cast(torch.ones(2, 3, 4, 5, device="npu"), 3)  # NC1HWC0
    assert torch_npu.get_npu_format(torch_npu._C._weak_ref_tensor(cast)) == 3
    torch.npu.synchronize()
    before = torch.npu.memory_allocated()
    del base, view, cast
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() < before and weak.shape == (3, 3)
    with pytest.raises(TypeError, match="_weak_ref_tensor: expected an npu tensor, got cpu"):
        torch_npu._C._weak_ref_tensor(torch.ones(2))


def test_custom_dtypes_storage_size_and_options(torch_npu, tmp_path):
    """torch_npu's custom dtype numbers (ACL's + 256) on torch_npu and _C._cd.DType; get_storage_size (an npu
    operator) counts the storage's elements, not the view's; use_compatible_impl is stored and read back;
    PathManager's folders."""
    assert (torch_npu.hifloat8, torch_npu.float4_e2m1fn_x2, torch_npu.float8_e8m0fnu) == (290, 296, 293)
    assert torch_npu._C._cd.DType.hifloat8 == torch_npu.hifloat8 and torch_npu.bfloat16 == 256 + 27
    base = torch.empty(4, 6, device="npu", dtype=torch.float16)
    assert torch_npu.get_storage_size(base[1:, :2]) == 24 == torch_npu.get_storage_size(base)
    assert torch_npu.get_storage_size is torch.ops.npu.get_storage_size  # an operator, as on torch_npu
    with pytest.raises(RuntimeError, match="get_storage_size: self must be on an npu device, got cpu"):
        torch_npu.get_storage_size(torch.ones(2))
    assert torch_npu.npu.OutOfMemoryError is torch.OutOfMemoryError
    try:
        torch_npu.npu.use_compatible_impl(True)
        assert torch_npu.npu.are_compatible_impl_enabled()
    finally:
        torch_npu.npu.use_compatible_impl(False)
    assert not torch_npu.npu.are_compatible_impl_enabled()
    from torch_npu.npu._memory_viz import format_flamegraph, segments
    from torch_npu.utils._path_manager import PathManager

    from npusim.runtime import memory_viz

    assert sys.modules["torch_npu.npu._memory_viz"] is memory_viz and segments is memory_viz.segments
    assert format_flamegraph is memory_viz.format_flamegraph
    folder = tmp_path / "results" / "run1"
    PathManager.make_dir_safety(str(folder))
    assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o750
    PathManager.create_file_safety(str(folder / "log.txt"))
    assert (folder / "log.txt").is_file() and ((folder / "log.txt").stat().st_mode & 0o777) == 0o640
    with pytest.raises(RuntimeError, match="expected a directory, got a file"):
        PathManager.check_input_directory_path(str(folder / "log.txt"))
    with pytest.raises(RuntimeError, match="the path does not exist"):
        PathManager.check_directory_path_readable(str(tmp_path / "missing"))
    with pytest.warns(UserWarning, match="Invalid input path"):
        PathManager.check_input_file_path(str(tmp_path / "a*b"))
    PathManager.remove_path_safety(str(tmp_path / "results"))
    assert not (tmp_path / "results").exists()
    PathManager.remove_path_safety(str(tmp_path / "results"))  # nothing to remove: nothing happens


def test_contrib_modules_compute_what_torch_npus_compute(torch_npu):
    """torch_npu.contrib.module: LabelSmoothingCrossEntropy gives torch_npu's own test figures (loss 3.8078 and
    its gradient row); Mish / SiLU are PyTorch's formulas with torch_npu's deprecation warning; ChannelShuffle
    interleaves the groups; Focus stacks the four pixel phases; the CANN-kernel modules are refused by name."""
    import numpy as np
    from torch_npu.contrib.module import ChannelShuffle, Focus, LabelSmoothingCrossEntropy, Mish, SiLU, Swish

    np.random.seed(123)  # torch_npu's test/contrib/test_crossentropy.py, first case
    x = torch.tensor(np.random.randn(2, 10), dtype=torch.float32).npu().requires_grad_()
    y = torch.tensor(np.random.randint(low=0, high=10, size=(2,)), dtype=torch.float32).npu()
    loss = LabelSmoothingCrossEntropy(10)(x, y)
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), torch.tensor(3.8078), atol=1e-4, rtol=0)
    torch.testing.assert_close(x.grad.cpu()[0], torch.tensor([0.0112, 0.0899, 0.0440, 0.0074, 0.0186, 0.1729, 0.0029,
                                                              0.0216, 0.1176, -0.4861]), atol=1e-4, rtol=0)
    smoothed = LabelSmoothingCrossEntropy(10, 0.1)
    assert (smoothed.on_value, smoothed.off_value) == (0.9, 0.1 / 9)
    with pytest.raises(ValueError, match=r"expected pred \(N, 10\) and target \(N,\), got \(2, 10\) and \(3,\)"):
        smoothed(x, y.new_zeros(3))

    t = torch.linspace(-3, 3, 13, device="npu")
    with pytest.warns(FutureWarning, match="torch_npu.contrib.module.Mish is deprecated"):
        mish = Mish()
    with pytest.warns(FutureWarning, match="torch_npu.contrib.module.SiLU is deprecated"):
        silu = Swish()
    assert Swish is SiLU
    torch.testing.assert_close(mish(t).cpu(), (t * torch.tanh(torch.nn.functional.softplus(t))).cpu())
    torch.testing.assert_close(silu(t).cpu(), (t * torch.sigmoid(t)).cpu())

    a = torch.arange(4.0, device="npu").reshape(1, 4, 1, 1)
    b = a + 10
    first, second = ChannelShuffle(8, groups=2).npu()(a, b)  # groups [0..3] and [10..13], interleaved
    assert first.flatten().tolist() == [0, 10, 1, 11] and second.flatten().tolist() == [2, 12, 3, 13]
    full = ChannelShuffle(8, groups=4, split_shuffle=False)(a, b)
    assert full.flatten().tolist() == [0, 2, 10, 12, 1, 3, 11, 13]
    with pytest.raises(ValueError, match=r"in_channels \(6\) must be a positive multiple of groups \(4\)"):
        ChannelShuffle(6, groups=4)

    image = torch.arange(16.0, device="npu").reshape(1, 1, 4, 4)
    focus = Focus(1, 4).npu()
    assert focus(image).shape == (1, 4, 2, 2)
    phases = torch.cat([image[..., ::2, ::2], image[..., 1::2, ::2], image[..., ::2, 1::2], image[..., 1::2, 1::2]], 1)
    conv = focus.conv
    torch.testing.assert_close(focus(image), conv.act(conv.bn(conv.conv(phases))))
    with pytest.raises(AttributeError, match=r"torch_npu\.contrib\.module\.ROIAlign is not simulated by npusim: "
                                             r"it needs op-plugin's npu_roi_align kernel"):
        torch_npu.contrib.module.ROIAlign  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'DCNv2'"):
        from torch_npu.contrib.module import DCNv2  # noqa: F401
    assert torch_npu.contrib.module.ChannelShuffle is ChannelShuffle


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
