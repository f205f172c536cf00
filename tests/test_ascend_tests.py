"""npusim ascend-tests: which of op-plugin's files it takes, and one file's counts from its own pytest run."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from npusim.tools import ascend_tests


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_fused_operator_files_are_the_per_op_tests_calling_an_implemented_operator(tmp_path):
    """A file counts when it calls an operator npusim implements beyond format casts (or tests the casts);
    core_tests/ (every op's fake kernel) and files calling only other operators do not."""
    ops = _write(tmp_path / "test_custom_ops/test_npu_rms_norm.py", "torch_npu.npu_rms_norm(x, w)\n")
    _write(tmp_path / "test_custom_ops/test_npu_quantize.py", "torch_npu.npu_quantize(x)\n")
    _write(tmp_path / "test_base_ops/test_add.py", "torch_npu.npu_format_cast(x, 29) + 1\n")
    cast = _write(tmp_path / "test_base_ops/test_format_cast.py", "torch_npu.npu_format_cast_(x, 29)\n")
    _write(tmp_path / "core_tests/test_fake_tensor.py", "torch.ops.npu.npu_rms_norm(x, w)\n")
    chosen = ascend_tests.fused_operator_files(tmp_path, {"npu_rms_norm", "npu_format_cast", "npu_format_cast_"})
    assert chosen == [cast, ops]


def test_one_files_counts_and_the_timeout(tmp_path, capsys):
    """Passes, failures, errors and skips come from the file's own junit report; a file past the timeout is
    killed and reported as such; the summary counts tests that ran and files that pass whole."""
    good = _write(tmp_path / "test_mixed.py", """
        import pytest
        import torch
        import torch_npu

        def test_pass():
            assert torch.ones(2, device="npu").sum().item() == 2

        def test_fail():
            assert False

        @pytest.fixture
        def broken():
            raise RuntimeError("setup")

        def test_error(broken):
            pass

        @pytest.mark.skip(reason="no")
        def test_skip():
            pass
        """)
    slow = _write(tmp_path / "test_slow.py", "import time\n\ndef test_sleep():\n    time.sleep(120)\n")
    result = ascend_tests.run_file("demo", good, timeout=120, scratch=tmp_path)
    assert (result.status, result.passed, result.failed, result.errors, result.skipped) == ("ran", 1, 1, 1, 1)
    stuck = ascend_tests.run_file("demo", slow, timeout=2, scratch=tmp_path)
    assert stuck.status == "timeout" and stuck.ran == 0
    assert ascend_tests.summary([result, stuck], "demo") == (
        "demo: 1 of 3 tests pass (1 skipped); 0 of 2 files pass whole; 1 files timed out or crashed")


def test_op_plugins_allowlist_goes_where_torch_npus_public_bindings_test_reads_it(tmp_path):
    """With both sources, op-plugin's allowlist of public operators lands in the extracted torch_npu tree's
    third_party/op-plugin/test/ (its submodule's place), once; an existing file there is left alone."""
    op_plugin_test = tmp_path / "op-plugin" / "test"
    _write(op_plugin_test / "allowlist_for_publicAPI.json", '{"torch_npu": {"all_version": ["npu_rms_norm"]}}')
    repo = tmp_path / "pytorch"
    assert ascend_tests.place_op_plugin_allowlist(repo, op_plugin_test)
    placed = repo / "third_party/op-plugin/test/allowlist_for_publicAPI.json"
    assert placed.read_text() == '{"torch_npu": {"all_version": ["npu_rms_norm"]}}'
    placed.write_text("{}")
    assert not ascend_tests.place_op_plugin_allowlist(repo, op_plugin_test) and placed.read_text() == "{}"
    assert not ascend_tests.place_op_plugin_allowlist(tmp_path / "other", tmp_path / "nowhere")


def test_the_command_needs_a_source(capsys):
    parser = argparse.ArgumentParser()
    ascend_tests.add_arguments(parser)
    assert ascend_tests.run(parser.parse_args([])) == 2
    assert "give --op-plugin and/or --torch-npu" in capsys.readouterr().err
