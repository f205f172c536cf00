"""torchair under npusim run: ``import torchair`` is torch_npu's ``torch_npu.dynamo.torchair``, MindSpeed's
op-builder imports and converter registrations work, its npu backend is npusim's inductor backend in the
config's mode, and what needs Ascend's graph engine is refused naming the call."""

from __future__ import annotations

import importlib.util
import logging
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from npusim.compat import torch_npu as shim
from npusim.testing.torchrun import run_bounded


@pytest.fixture
def torchair() -> Iterator[object]:
    shim.install()
    try:
        import torchair

        yield torchair
    finally:
        shim.uninstall()


def test_torchair_is_torch_npus_own_and_only_under_npusim_run(torchair):
    """``torchair`` and its submodules are the modules of ``torch_npu.dynamo.torchair`` (one object each);
    nothing named torchair exists once npusim run's finder is gone."""
    import torch_npu
    import torchair.ge
    import torchair.ge_concrete_graph.fx2ge_converter as converters

    assert torchair is torch_npu.dynamo.torchair
    assert torchair.ge is sys.modules["torch_npu.dynamo.torchair.ge"]
    assert converters is sys.modules["torch_npu.dynamo.torchair.ge_concrete_graph.fx2ge_converter"]
    shim.uninstall()
    assert importlib.util.find_spec("torchair") is None and "torchair" not in sys.modules
    shim.install()


def test_mindspeed_op_builder_imports_and_registers_its_converter(torchair):
    """MindSpeed's op builders' module-level code (gmm_builder.py: torchair's second API, else its first)
    imports, and the converter it registers is recorded for its operator, never run."""
    from torchair import ge, register_fx_node_ge_converter
    from torchair.ge import DataType, Tensor, TensorSpec
    from torchair.ge_concrete_graph import ge_apis  # noqa: F401  (the first API's names import too)
    from torchair.ge_concrete_graph.fx2ge_converter import CONVERTERS, declare_supported
    from torchair.ge_concrete_graph.ge_graph import compat_as_bytes, get_default_ge_graph  # noqa: F401

    @declare_supported([])
    @register_fx_node_ge_converter(torch.ops.aten.addmm.default)
    def convert_addmm(x: Tensor, y: Tensor, z: Tensor, meta_outputs: TensorSpec = None) -> Tensor:
        return ge.custom_op("MatMulV2", inputs={"x1": y, "x2": z}, outputs=["y"])

    assert CONVERTERS[torch.ops.aten.addmm.default] is convert_addmm
    assert DataType.DT_BF16 == 27 and DataType.DT_FLOAT == 0  # GE's numbering
    with pytest.raises(NotImplementedError, match=r"torchair.ge.custom_op\('MatMulV2'\): Ascend graph-engine"):
        convert_addmm(None, None, None)
    with pytest.raises(TypeError, match="register_fx_node_ge_converter: expected a torch operator"):
        register_fx_node_ge_converter("npu_gmm")


def test_graph_engine_calls_and_other_names_are_refused_by_name(torchair):
    """Building GE graph pieces raises GraphEngineNotSimulated naming the call; torchair's names npusim
    has not are AttributeErrors naming them; patch_for_hcom logs, as torchair does on torch >= 2.3.1,
    and patches nothing."""
    from torchair import ge

    for call, pattern in [(lambda: ge.Const(0), r"torchair.ge.Const"),
                          (lambda: ge.attr.Int(3), r"torchair.ge.attr.Int\(3\)"),
                          (lambda: ge.TensorSpec(), r"torchair.ge.TensorSpec"),
                          (lambda: torchair.ge_concrete_graph.ge_apis.Fill([0], 0), r"ge_apis.Fill")]:
        with pytest.raises(torchair.GraphEngineNotSimulated, match=pattern):
            call()
    with pytest.raises(AttributeError, match=r"torchair.dynamo_export is not simulated by npusim: exporting"):
        torchair.dynamo_export  # noqa: B018
    all_reduce = dist.all_reduce
    logger = logging.getLogger("torchair")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        torchair.patch_for_hcom()
    finally:
        logger.removeHandler(handler)
    assert dist.all_reduce is all_reduce
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "no need to call patch_for_hcom" in records[0].getMessage()


def test_compiler_config_checks_mode_and_keeps_graph_engine_options(torchair):
    """CompilerConfig: mode is one of torchair's three; graph-engine options are kept and read back as
    torchair's (``.value``); an unknown option or a group assigned a value is refused naming it."""
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    assert config.mode.value == "max-autotune"
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "pbtxt"
    config.experimental_config.frozen_parameter = True
    assert config.mode.value == "reduce-overhead" and config.debug.graph_dump.type.value == "pbtxt"
    assert config.settings() == {"mode": "reduce-overhead", "debug.graph_dump.type": "pbtxt",
                                 "experimental_config.frozen_parameter": True}
    with pytest.raises(ValueError, match=r"mode must be one of max-autotune, reduce-overhead, npugraph_ex, got 'fast'"):
        config.mode = "fast"
    with pytest.raises(AttributeError, match=r"CompilerConfig has no option 'graph_mode'"):
        config.graph_mode = 1
    with pytest.raises(AttributeError, match=r"ge_config is a group of options"):
        config.ge_config = {}
    with pytest.raises(TypeError, match=r"compiler_config must be a torchair.CompilerConfig, got dict"):
        torchair.get_npu_backend(compiler_config={})


def _sin_mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).sin().sum(-1)


def test_npu_backend_is_inductor_with_custom_decompositions(torchair):
    """get_npu_backend() compiles with npusim's inductor backend (generated C++ kernels, eager's values);
    custom_decompositions replace inductor's for their operators."""
    x, w = torch.randn(8, 16, device="npu"), torch.randn(16, 4, device="npu")
    torch._dynamo.reset()
    got, codes = run_and_get_code(torch.compile(_sin_mlp, backend=torchair.get_npu_backend()), x, w)
    assert any("cpp_fused" in code for code in codes)
    torch.testing.assert_close(got.cpu(), _sin_mlp(x, w).cpu())

    def sin_as_cos(t: torch.Tensor) -> torch.Tensor:
        return torch.cos(t)

    torch._dynamo.reset()
    backend = torchair.get_npu_backend(custom_decompositions={torch.ops.aten.sin.default: sin_as_cos})
    decomposed = torch.compile(_sin_mlp, backend=backend)(x, w)
    torch.testing.assert_close(decomposed.cpu(), (x @ w).cos().sum(-1).cpu())


def test_reduce_overhead_mode_replays_through_npu_graphs(torchair):
    """CompilerConfig.mode = "reduce-overhead" (torchair's NPU graphs) hands the compiled graph to npusim's
    npu graph trees; replays give eager's values."""
    config = torchair.CompilerConfig()
    config.mode = "reduce-overhead"
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_sin_mlp, backend=torchair.get_npu_backend(compiler_config=config))
    x, w = torch.randn(8, 16, device="npu"), torch.randn(16, 4, device="npu")
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w).cpu(), _sin_mlp(x, w).cpu())
    assert counters["inductor"]["npugraph_wrapped"] == 1


def test_mindspeed_import_pattern_under_npusim_run(tmp_path):
    """Under ``python -m npusim run``, a script doing what MindSpeed's op builders and graph-mode tests do
    (torchair's API at module level, before any ``import torch_npu``; then compile with get_npu_backend)
    runs, and so does its spawned child, whose first import is torchair's."""
    script = tmp_path / "mindspeed_like.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing

        import torch
        import torchair as tng
        from torchair import ge, register_fx_node_ge_converter
        from torchair.ge import DataType, Tensor, TensorSpec
        from torchair.configs.compiler_config import CompilerConfig


        def child(queue):
            import torch_npu

            queue.put(tng is torch_npu.dynamo.torchair and DataType.DT_BF16 == 27)


        if __name__ == "__main__":
            backend = tng.get_npu_backend(compiler_config=CompilerConfig())
            x = torch.randn(4, 4).npu()
            compiled = torch.compile(lambda t: t * 2 + 1, backend=backend)(x)
            print("RESULT", torch.equal(compiled.cpu(), x.cpu() * 2 + 1))
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            print("CHILD", queue.get(timeout=120))
            proc.join()
    """))
    done = run_bounded([sys.executable, "-m", "npusim", "run", str(script)], 300, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT True" in done.stdout and "CHILD True" in done.stdout
