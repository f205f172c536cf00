"""The byte ranges the sanitizer tracks: a storage, named by (device, data pointer), and a span of it.

Device -1 (``state.HOST_DEVICE``) is host memory. Kept apart from ``state`` so that graph records,
which ``state`` holds, can name spans without importing it.
"""

from __future__ import annotations

from typing import NamedTuple

StorageId = tuple[int, int]  # (device or HOST_DEVICE, data pointer)


class Span(NamedTuple):
    storage: StorageId
    lo: int
    hi: int
