"""Give the C heap's free memory back to the kernel now and then.

glibc's malloc returns freed memory to the kernel only from the top of its heaps; what a burst freed in the middle
(HTTP bodies, decoded watch events: anything Python allocates above 512 bytes goes to malloc) stays in the
process's RSS until malloc_trim is called. Measured with the bench's heap profile at N=200 once every SpecServing was
Ready: glibc held 62 MiB free of its 88 MiB, and one malloc_trim(0) took RSS from 196 to 149 MiB
(docs/benchmarks.md). Elsewhere (musl, macOS) there is no malloc_trim, and this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("specserving.reconcile")

TRIM_SECONDS = 10.0


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


async def trim_every(seconds: float = TRIM_SECONDS) -> None:
    """Trim the heap every `seconds` (on a thread: ctypes lets go of the GIL, and a trim walks the whole heap)."""
    trim = malloc_trim()
    if trim is None:
        log.info("no malloc_trim in this C library: freed heap memory stays with the process")
        return
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim)
