"""Allocation patterns that made the old exact-size cache grow without bound (issue 24): a loop over shrinking
sizes, and PyTorch's ``test_cudnn_multiple_threads_same_device`` (conv2d from several threads, each image a row
smaller per call). ``tests/test_caching_allocator.py`` runs them small, ``python -m npusim bench allocator`` at
PyTorch's sizes."""

from __future__ import annotations

import threading

import torch


def shrinking_sizes(steps: int, top_bytes: int, device: int, bottom_bytes: int = 0) -> None:
    """``steps`` tensors of sizes shrinking evenly from ``top_bytes`` towards ``bottom_bytes``, each written and
    dropped for the next."""
    for k in range(steps):
        nbytes = bottom_bytes + (top_bytes - bottom_bytes) * (steps - k) // steps
        t = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("npu", device))
        t.fill_(1)
    torch.npu.synchronize(device)


def conv2d_threads(image: int, iters: int, threads: int, trials: int, device: int) -> None:
    """PyTorch's test_cudnn_multiple_threads_same_device on ``device``: each thread runs ``iters`` 2x2 conv2d
    (each shrinking its image by a row and a column) and ``div_`` on a stream of its own; checks the sums."""
    weight = torch.ones((1, 1, 2, 2), device=torch.device("npu", device))
    results: dict[int, torch.Tensor] = {}
    barrier = threading.Barrier(threads)

    def worker(t: int) -> None:
        torch.npu.set_device(device)
        stream = torch.npu.Stream()
        torch.npu.synchronize()
        barrier.wait()
        with torch.npu.stream(stream):
            for _ in range(iters):
                results[t] = torch.nn.functional.conv2d(results[t], weight, padding=0)
                results[t].div_(4.0)
        torch.npu.synchronize()

    for _ in range(trials):
        for t in range(threads):
            results[t] = torch.ones((1, 1, image, image), device=torch.device("npu", device))
        workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for t in range(threads):
            got = results[t].sum().item()
            if got != (image - iters) ** 2:
                raise AssertionError(f"conv2d_threads: thread {t} summed to {got}, expected {(image - iters) ** 2}")
