"""Random bytes from the operating system, read in chunks: a row id or a request id each asked
the kernel for its own (a ``getrandom`` system call, 8 an admission), now they take a slice of
a chunk read once per few hundred ids. The bytes are the kernel's, as unpredictable as before."""

from __future__ import annotations

import os
import threading

CHUNK = 4096


class _Chunk(threading.local):
    """Each thread's own chunk: no lock, no slice handed to two threads."""

    def __init__(self) -> None:
        self.data = b""
        self.used = 0


_chunk = _Chunk()


def random_bytes(n: int) -> bytes:
    """``n`` bytes (at most ``CHUNK``) from the operating system's random source."""
    chunk = _chunk
    start = chunk.used
    if start + n > len(chunk.data):
        chunk.data, start = os.urandom(CHUNK), 0
    chunk.used = start + n
    return chunk.data[start : start + n]


def _forget() -> None:
    # A forked child would otherwise hand out the bytes its parent goes on handing out.
    _chunk.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_forget)
