"""npu kernels keep subnormal floats whatever torch.set_flush_denormal says, on the stream worker and on the host
alike, as CUDA's do; only .item()'s conversion to a Python number follows the host's setting (Note [Subnormals on
npu], csrc/runtime/subnormals.h)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import npusim

# A fresh process: the user flushes subnormals before the npu's first task, so the stream worker is created by a
# thread that flushes (a new thread inherits its creator's setting).
_CHILD = """
import json, torch, npusim
from npusim.runtime import acl
out = {"flush_supported": torch.set_flush_denormal(True)}
a, b = torch.full((4096,), 1e-30), torch.full((4096,), 1e-10)  # products of 1e-40: subnormal in float32
word = lambda t: t.cpu().view(torch.int32)[0].item()  # the bits, read without a float conversion
out["cpu"] = word(a * b)
an, bn = a.to("npu"), b.to("npu")
torch.npu._sleep(10**6)  # the stream's first task: its worker starts now
enqueued = acl.stream_enqueued(0, 0)
worker = an * bn
out["worker_tasks"] = acl.stream_enqueued(0, 0) - enqueued
out["worker"] = word(worker)
torch.npu.synchronize()
out["host_iterator"] = word(an * bn)  # a small op on an idle stream: the host runs it
out["host_fallback"] = word(torch.addcmul(torch.zeros(4096, device="npu"), an, bn))
out["converting_copy"] = (an * bn).to(torch.float64).cpu()[0].view(torch.int64).item()
out["item_flushing"] = (an * bn)[0].item()
torch.set_flush_denormal(False)
out["item"] = (an * bn)[0].item()
print(json.dumps(out))
"""


def test_npu_keeps_subnormals_under_set_flush_denormal():
    """With flushing on before the npu's first task: CPU's product is 0, npu's is the subnormal on the worker, on the
    host's iterator and fallback paths and through a converting copy; .item() converts it on the host, to 0.0 while
    flushing and to 1e-40 after."""
    result = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300,
                            env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    if not out["flush_supported"]:
        pytest.skip("torch.set_flush_denormal is not supported on this CPU")
    subnormal = np.float32(1e-30) * np.float32(1e-10)
    assert subnormal != 0 and abs(subnormal) < np.finfo(np.float32).tiny
    word = int(np.array([subnormal], dtype=np.float32).view(np.int32)[0])
    assert out["cpu"] == 0  # the setting is in effect on the CPU
    assert out["worker_tasks"] == (0 if npusim.config.launch_blocking() else 1)
    assert (out["worker"], out["host_iterator"], out["host_fallback"]) == (word, word, word)
    assert out["converting_copy"] == int(np.array([np.float64(subnormal)]).view(np.int64)[0])
    assert out["item_flushing"] == 0.0
    assert out["item"] == pytest.approx(float(subnormal), rel=1e-6)


def test_the_default_keeps_subnormals_everywhere_as_cpu_does():
    """Without flushing, npu and CPU give the same subnormal products."""
    a, b = torch.full((64,), 1e-30), torch.full((64,), 1e-10)
    assert torch.equal((a.to("npu") * b.to("npu")).cpu().view(torch.int32), (a * b).view(torch.int32))
    assert (a * b)[0].item() != 0.0
