"""The main job, `python -m npusim demo`, runs end to end (single process and 2-rank FSDP2)."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_end_to_end():
    """The demo trains on npu like CPU, shows the fast route, and runs unpatched FSDP2 on 2 ranks."""
    result = subprocess.run([sys.executable, "-m", "npusim", "demo", "--steps", "3"], capture_output=True,
                            text=True, timeout=420)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "fast   pairs=100  chunks=3 non_blocking passed down=True" in out
    assert "destinations equal sources: True" in out
    assert "world size 2, backend hccl" in out
    assert "by route during training (all-gather copy-in included): {'fast': " in out
    assert "FSDP2 patch audit: clean" in out
