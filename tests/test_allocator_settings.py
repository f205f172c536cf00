"""PYTORCH_NPU_ALLOC_CONF: every key torch_npu's NPUAllocatorConfig accepts, with its value rules, read when the
allocator initialises (not at import), torch_npu's _set_allocator_settings at run time, and what the honoured
keys do (roundup_power2_divisions figures, per_process_memory_fraction, garbage_collection_threshold)."""

from __future__ import annotations

import json

import pytest
import torch

from _allocator_util import MIB, stat
from npusim import config
from test_device import run_python

# One valid setting of every key torch_npu accepts (PyTorch's AcceleratorAllocatorConfig keys it supports, and its own).
EVERY_KEY = {
    "max_split_size_mb": "64", "max_non_split_rounding_mb": "32", "garbage_collection_threshold": "0.6",
    "roundup_power2_divisions": "[64:8,256:4,>:1]", "expandable_segments": "False", "large_segment_size_mb": "32",
    "pinned_use_background_threads": "True", "pinned_max_round_threshold_mb": "16", "pinned_max_cached_size_mb": "64",
    "pin_memory_expandable_segments": "False", "pinned_mem_register": "False", "base_addr_aligned_kb": "16",
    "page_size": "1g", "segment_size_mb": "64", "multi_stream_lazy_reclaim": "True",
    "pinned_reserve_segment_size_mb": "8",
    "per_process_memory_fraction": "0.5", "release_lock_on_npumalloc": "True", "throw_on_npumalloc_oom": "True",
}


def test_every_torch_npu_key_is_accepted():
    """All 19 keys parse; the honoured ones are typed, the others kept as given (they mean nothing for host memory)."""
    conf = config.parse_alloc_conf(",".join(f"{k}:{v}" for k, v in EVERY_KEY.items()))
    assert (conf.max_split_size, conf.max_non_split_rounding, conf.large_segment_size) == (64 * MIB, 32 * MIB, 32 * MIB)
    assert conf.garbage_collection_threshold == 0.6 and conf.per_process_memory_fraction == 0.5
    assert conf.roundup_power2_divisions == (8,) * 7 + (0, 4) + (1,) * 7  # 128 MiB: no entry, no division
    assert dict(conf.without_effect) == {k: EVERY_KEY[k] for k in config.ALLOC_CONF_WITHOUT_EFFECT}
    assert set(config.ALLOC_CONF_WITHOUT_EFFECT) | {
        "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold", "roundup_power2_divisions",
        "expandable_segments", "large_segment_size_mb", "per_process_memory_fraction"} == set(EVERY_KEY)


def test_roundup_power2_divisions_list_form():
    """The list form fills intervals as PyTorch does: the first boundary covers those below, '>' those above."""
    conf = config.parse_alloc_conf("roundup_power2_divisions:[8:1,64:4,128:8,256:2,>:16]")
    assert conf.roundup_power2_divisions == (1, 1, 1, 1, 0, 0, 4, 8, 2) + (16,) * 7  # torch_npu's test comment
    assert config.parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


@pytest.mark.parametrize(("text", "error"), [
    ("nonsense:1", "PYTORCH_NPU_ALLOC_CONF: expected comma-separated key:value with keys .*got 'nonsense:1'"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold: expected a number in \\(0, 1\\)"),
    ("max_split_size_mb:19", "max_split_size_mb: expected at least 20 \\(MiB, the large segment size\\)"),
    ("large_segment_size_mb:40,max_split_size_mb:30", "max_split_size_mb: expected at least 40"),
    ("large_segment_size_mb:10", "large_segment_size_mb: expected more than 10"),
    ("max_split_size_mb:99999999999999999999", "max_split_size_mb: expected an integer in \\[20, 8796093022207\\]"),
    ("max_non_split_rounding_mb:8796093022208", "max_non_split_rounding_mb: expected an integer in \\[20, 87960930"),
    ("large_segment_size_mb:8796093022208", "large_segment_size_mb: expected more than 10 and at most 8796093022207"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions: expected a power of two"),
    ("roundup_power2_divisions:[64:3]", "roundup_power2_divisions: expected powers of two"),
    ("roundup_power2_divisions:[64:36893488147419103232]", "roundup_power2_divisions: expected powers of two up to "
     "4611686018427387904"),
    ("expandable_segments:true", "expandable_segments: expected True or False"),
    ("base_addr_aligned_kb:17", "base_addr_aligned_kb: expected an integer in \\[0, 16\\]"),
    ("segment_size_mb:8", "segment_size_mb: expected an integer in \\[20, 512\\]"),
    ("page_size:2m", "page_size: expected 1g"),
    ("per_process_memory_fraction:1.5", "per_process_memory_fraction: expected a number in \\[0, 1\\]"),
    ("expandable_segments:True,max_split_size_mb:64", "cannot be enabled with expandable_segments"),
])
def test_bad_values_are_errors_naming_the_variable(text, error):
    """A bad key or value raises ConfigError (a ValueError) naming the variable and what it accepts."""
    with pytest.raises(config.ConfigError, match=error):
        config.parse_alloc_conf(text)


def test_both_variables_set_is_an_error(monkeypatch):
    """PYTORCH_NPU_ALLOC_CONF or PYTORCH_ALLOC_CONF, not both (torch_npu's rule)."""
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    assert config.alloc_conf().max_split_size == 64 * MIB
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:128")
    with pytest.raises(config.ConfigError, match="are both set"):
        config.alloc_conf()


def test_conf_is_read_when_the_allocator_initialises():
    """A variable set after import is honoured at the first allocation (torch_npu's figures for its
    test_roundup_power2_divisions list); a bad one lets import succeed and fails the first allocation."""
    code = """
        import json, os, torch, npusim
        os.environ["PYTORCH_NPU_ALLOC_CONF"] = "roundup_power2_divisions:[8:1,64:4,128:8,256:2,>:16]"
        MIB = 1 << 20
        sizes = {}
        for n in (513, 1025, 33 * MIB, 65 * MIB, 200 * MIB, 510 * MIB, 513 * MIB):
            x = torch.empty(n, dtype=torch.uint8, device="npu")
            sizes[n] = torch.npu.memory_allocated()
            del x
            torch.npu.empty_cache()
        print(json.dumps(sizes))
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    mib = MIB
    assert {int(k): v for k, v in json.loads(result.stdout).items()} == {
        513: 1024, 1025: 1536, 33 * mib: 34 * mib, 65 * mib: 80 * mib, 200 * mib: 208 * mib, 510 * mib: 512 * mib,
        513 * mib: 544 * mib}
    code = """
        import torch, npusim
        try:
            torch.empty(8, device="npu")
        except ValueError as e:
            print("first allocation:", e)
        try:
            torch.empty(8, device="npu")
        except ValueError as e:
            print("again:", e)
    """
    result = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "max_split_size:5"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PYTORCH_NPU_ALLOC_CONF: expected comma-separated key:value") == 2, result.stdout


def test_size_too_large_for_the_allocator_is_an_error_naming_the_key():
    """A size key whose bytes do not fit the allocator's 64 bits fails the first allocation with a ValueError
    naming the variable, the key and its range (not the binding's argument types); the largest one is held."""
    code = """
        import torch, npusim
        try:
            torch.empty(8, device="npu")
        except ValueError as e:
            print(e)
    """
    result = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:99999999999999999999"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("PYTORCH_NPU_ALLOC_CONF max_split_size_mb: expected an integer in "
                                     "[20, 8796093022207] (MiB; the most whose byte count fits in 64 bits), "
                                     "got '99999999999999999999'")
    code = """
        import torch, npusim
        torch.empty(8, device="npu")
        print(torch.npu.memory._snapshot()["allocator_settings"]["max_split_size"])
    """
    result = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:8796093022207"})
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 8796093022207 * MIB


def test_fraction_key_and_pytorch_alloc_conf():
    """per_process_memory_fraction caps every device from the first allocation; PYTORCH_ALLOC_CONF is read as well."""
    code = """
        import torch, npusim
        print(torch.npu.get_per_process_memory_fraction(0), torch.npu.get_per_process_memory_fraction(3))
        try:
            torch.empty(40 << 20, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError as e:
            print("oom", "capacity 64.00 MiB" in str(e))
        torch.npu.set_per_process_memory_fraction(1.0)  # the caller's setting wins over the variable's
        print(torch.empty(40 << 20, dtype=torch.uint8, device="npu").numel())
    """
    result = run_python(code, env={"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.5",
                                   "NPUSIM_MEMORY_CAPACITY": "64MiB"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0.5", "0.5", "oom", "True", str(40 << 20)]


def test_set_allocator_settings_reparses_at_run_time(clean_npu):
    """torch.npu.memory._set_allocator_settings takes torch_npu's run-time keys; the three keys PyTorch resets on
    every parse go back to their defaults; other keys raise ValueError naming the call."""
    memory = torch.npu.memory
    try:
        memory._set_allocator_settings("max_split_size_mb:40,expandable_segments:False")
        assert stat("max_split_size") == 40 * MIB
        assert memory._snapshot()["allocator_settings"]["max_split_size"] == 40 * MIB
        memory._set_allocator_settings("max_non_split_rounding_mb:64")
        assert stat("max_split_size") == -1
        assert torch.npu.memory._snapshot()["allocator_settings"]["max_non_split_rounding"] == 64 * MIB
        with pytest.raises(ValueError, match="_set_allocator_settings: unsupported setting 'garbage_collection_thr"):
            memory._set_allocator_settings("garbage_collection_threshold:0.5")
        memory._set_allocator_settings("per_process_memory_fraction:0.25")
        assert torch.npu.get_per_process_memory_fraction(2) == 0.25
    finally:
        memory._set_allocator_settings("per_process_memory_fraction:1.0,max_non_split_rounding_mb:20")
    assert torch.npu.get_per_process_memory_fraction(2) == 1.0


def test_set_allocator_settings_takes_roundup_power2_divisions(clean_npu):
    """_set_allocator_settings accepts roundup_power2_divisions as PYTORCH_NPU_ALLOC_CONF does (torch_npu's
    test_allocator_settings): with 4 divisions an 84 MiB request takes 96 MiB, the next parse without the key
    goes back to the 2 MiB rounding, and the list form applies per size."""
    memory = torch.npu.memory
    nbytes = 21 * MIB * 4  # torch_npu's test: 21 Mi float32 elements

    def allocated_by(settings: str) -> int:
        memory._set_allocator_settings(settings)
        before = stat("active_bytes.all.allocated")
        x = torch.empty(nbytes // 4, device="npu")
        grown = stat("active_bytes.all.allocated") - before
        del x
        torch.npu.empty_cache()  # the next request must not reuse this block
        return grown

    try:
        assert allocated_by("roundup_power2_divisions:4") == 96 * MIB  # 64 MiB + 2 steps of 16 MiB
        assert memory._snapshot()["allocator_settings"]["roundup_power2_divisions"][6] == 4  # the [64, 128) interval
        assert allocated_by("max_split_size_mb:40") == nbytes  # reset: no divisions
        assert allocated_by("roundup_power2_divisions:[64:8,128:2,>:1]") == 88 * MIB  # 64 MiB + 3 steps of 8 MiB
    finally:
        memory._set_allocator_settings("")


def test_garbage_collection_threshold_frees_the_oldest_cached_blocks():
    """Over threshold x limit, cached unsplit large blocks are freed, those older than the average first, before a
    new segment is mapped: three 30 MiB blocks older than a 40 MiB one go, the 40 MiB stays."""
    code = """
        import torch, npusim
        MIB = 1 << 20
        a, b, c = (torch.empty(30 * MIB, dtype=torch.uint8, device="npu") for _ in range(3))
        del a, b, c
        d = torch.empty(40 * MIB, dtype=torch.uint8, device="npu")  # reserved 90 MiB <= 100: nothing collected
        del d
        e = torch.empty(50 * MIB, dtype=torch.uint8, device="npu")  # 130 MiB > 100: collect, then map
        s = torch.npu.memory_stats()
        print(s["num_device_free"], s["reserved_bytes.all.current"] // MIB,
              sorted(seg["total_size"] // MIB for seg in torch.npu.memory_snapshot()))
    """
    result = run_python(code, env={"PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.5",
                                   "NPUSIM_MEMORY_CAPACITY": "200MiB"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "90", "[40,", "50]"]
