"""Building and loading the C++ extensions: install-time build, first-use compile, the build lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from npusim import _build
from npusim._sources import EXTENSIONS, source_hash

# A C++ file without torch headers compiles in about a second: enough to exercise the lock.
TINY_SOURCE = "extern \"C\" int npusim_build_test_answer() { return 42; }\n"


def _jit_in_subprocess(build_dir: Path, source: Path) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        from pathlib import Path
        from npusim import _build
        path = _build.jit_build("npusim_lock_test", [Path({str(source)!r})], Path({str(build_dir)!r}),
                                reason="test", python_module=False)
        print("built", Path(path).name)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_first_builds_build_once_and_a_stale_lock_does_not_block(tmp_path):
    """Two processes building one extension at once both load it, built once; then a stale torch lock is removed."""
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    build_dir = tmp_path / "cache" / "npusim_lock_test" / "h"
    procs = [_jit_in_subprocess(build_dir, source) for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "built npusim_lock_test.so"  # ninja's progress went to stderr
    assert len(list(build_dir.glob("*.so"))) == 1
    compiled = [err for _, err in outputs if "npusim: compiling the C++ extension npusim_lock_test (test)" in err]
    assert len(compiled) == 1  # the second process found the first one's build
    # torch's own baton, as a killed build leaves it: the next load must not wait for it.
    (build_dir / "lock").write_text("")
    proc = _jit_in_subprocess(build_dir, source)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "npusim: compiling" not in err and not (build_dir / "lock").exists()


def test_missing_compiler_gives_clear_error(tmp_path):
    """A fresh build without a C++ compiler raises BuildError naming what to install."""
    env = {**os.environ, "NPUSIM_BUILD_DIR": str(tmp_path), "PATH": os.path.dirname(sys.executable),
           "CXX": "no-such-compiler"}
    result = subprocess.run([sys.executable, "-c", "import npusim"], capture_output=True, text=True, timeout=180,
                            env=env)
    assert result.returncode != 0
    assert "BuildError" in result.stderr and "needs a C++ compiler (g++)" in result.stderr


@pytest.mark.skipif(_build._installed_build_hash("npusim_C") is None,
                    reason="this checkout was not installed with `pip install --no-build-isolation -e .`")
def test_installed_build_is_current_and_imported_without_compiling():
    """After `make install` both extensions are prebuilt for these sources, and a fresh import compiles nothing."""
    for name, sources in EXTENSIONS.items():
        assert _build._installed_build_hash(name) == source_hash(sources, torch.__version__), name
    env = {k: v for k, v in os.environ.items() if k != "NPUSIM_BUILD_DIR"}
    code = "import torch, npusim, npusim.distributed.backend as b; b.load(); print(torch.npu.device_count())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "npusim: compiling" not in result.stderr
    import npusim.npusim_C as core

    assert Path(core.__file__).parent == Path(_build.__file__).parent


def test_changed_sources_are_compiled_with_a_message(monkeypatch, tmp_path):
    """When the sources differ from the install-time build, loading says why it compiles (into the cache)."""
    seen = {}

    def fake_jit(name, sources, build_dir, *, reason, python_module=True):
        seen.update(name=name, reason=reason, build_dir=build_dir)
        return "loaded"

    monkeypatch.delenv("NPUSIM_BUILD_DIR", raising=False)
    monkeypatch.setattr(_build, "_installed_build_hash", lambda name: "0" * 16)
    monkeypatch.setattr(_build, "jit_build", fake_jit)
    assert _build.load_extension("npusim_C") == "loaded"
    assert seen["reason"] == "its C++ sources changed since the install-time build"
    assert seen["build_dir"].name == source_hash(EXTENSIONS["npusim_C"], torch.__version__)


def test_every_cpp_file_is_in_exactly_one_unity_unit():
    """Note [Unity build]: a .cpp file missing from the units would not be built, one in two would be built twice."""
    from npusim._sources import CSRC, unit_members

    units = [unit for sources in EXTENSIONS.values() for unit in sources]
    members = [member for unit in units for member in unit_members(unit)]
    on_disk = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.cpp") if p.parent.name != "unity")
    assert sorted(members) == on_disk
    assert len(set(members)) == len(members)
    assert all(unit.startswith("unity/") for unit in units)


def test_source_hash_covers_the_files_a_unit_includes(monkeypatch, tmp_path):
    """Editing a .cpp that a unit includes changes the hash (so a stale build is never loaded)."""
    import npusim._sources as sources

    csrc = tmp_path / "csrc"
    (csrc / "unity").mkdir(parents=True)
    (csrc / "a.cpp").write_text("int a() { return 1; }\n")
    (csrc / "unity" / "u.cpp").write_text('// unit\n#include "../a.cpp"\n')
    monkeypatch.setattr(sources, "CSRC", csrc)
    assert sources.unit_members("unity/u.cpp") == ["a.cpp"]
    before = sources.source_hash(("unity/u.cpp",), "2.13.0")
    (csrc / "a.cpp").write_text("int a() { return 2; }\n")
    assert sources.source_hash(("unity/u.cpp",), "2.13.0") != before
