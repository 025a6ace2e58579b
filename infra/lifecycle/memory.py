"""Hand memory a finished stage freed back to the kernel, so the next stage starts from it.

The data stages run one after another in the flow's process (Prefect's threads). Each frees
its batches when it ends, but glibc keeps freed heap pages mapped for reuse, and pyarrow's
pool keeps its own: the process's RSS then climbs stage after stage although little is live.
`release_freed_memory` returns those pages (glibc `malloc_trim`, the Arrow pool's
`release_unused`) after a garbage collection, which also frees reference cycles at once.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from functools import cache


@cache
def _libc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> None:
    """Collect garbage, then return freed heap and Arrow pool pages to the kernel (best effort, cheap: ~ms)."""
    gc.collect()
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
    trim = _libc_trim()
    if trim is not None:
        trim(0)
