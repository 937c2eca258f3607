"""Reading a file in a background thread, ahead of its parser.

Decompressing a ``.bz2`` BAL file takes as long as parsing it (problem-49: about 0.06 s each on
the H200 machine's host), and Python's ``bz2``, ``gzip`` and plain reads release the GIL while
they work. So a thread that reads blocks ahead lets the decompression run beside the parser, and
a command-line tool that starts the reader first (:func:`start`) lets it run beside the OpenCL
driver's start-up, which holds the GIL (measured there: a thread creating the context left the
main thread a tenth of its Python speed). What the parser then waits for is whichever is slower.

:func:`start` keeps the reader for its path until :func:`take` hands it to the parser (one
reader per path; a reader nobody takes is closed at exit with the thread).
"""
from __future__ import annotations

import bz2
import os
import queue
import threading
import zlib
from typing import Dict, Optional

# Bytes read from the file at a time (compressed ones decompress to about 5-10 times more).
BLOCK_BYTES = 1 << 20
# Blocks read ahead before the thread waits for the parser: more than a whole problem-49 (0.45
# MB of .bz2, 29 MB of text) while the driver starts, bounded so that a file of gigabytes is
# not held twice.
AHEAD_BLOCKS = 32

_END = object()


class ReadAhead:
    """A read-only stream of ``path``'s bytes, decompressed when the name ends in ``.bz2`` or
    ``.gz``, whose ``read`` returns the next block that a thread has made (whatever size is asked:
    callers cut lines themselves). An error of the thread (the file missing, a corrupt archive) is
    raised by the ``read`` that reaches it, as reading the file in place would have raised it.

    The thread reads ``block`` compressed bytes at a time and decompresses each in one call: the
    GIL is released for the whole call, not taken back every 8 KiB as ``bz2.open`` does, so the
    work goes on while the main thread holds the GIL (in the OpenCL driver, say)."""

    def __init__(self, path, block: int = BLOCK_BYTES, ahead: int = AHEAD_BLOCKS):
        self._blocks: "queue.Queue" = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._done = False
        self._rest = memoryview(b"")
        self._thread = threading.Thread(target=self._run, args=(os.fspath(path), block), daemon=True,
                                        name="read-ahead")
        self._thread.start()

    def _run(self, path, block):
        try:
            with open(path, "rb") as f:
                for data in _decoded(f, path, block):
                    if self._stop.is_set():
                        return
                    if data:
                        self._put(data)
            self._put(_END)
        except BaseException as e:      # noqa: B902 - handed to the reader, who raises it
            self._put(e)

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._blocks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes (``size`` < 0: the next block), b"" at the end."""
        if not self._rest:
            if self._done:
                return b""
            item = self._blocks.get()
            if item is _END:
                self._done = True
                return b""
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self._rest = memoryview(item)
        cut = len(self._rest) if size is None or size < 0 else size
        out, self._rest = self._rest[:cut], self._rest[cut:]
        return out.tobytes()

    def close(self) -> None:
        self._stop.set()
        self._done = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_started: Dict[str, ReadAhead] = {}
_lock = threading.Lock()


def _decoded(f, path, block):
    """The file's bytes, block by block, decompressed by its suffix. Several concatenated streams
    (pbzip2, ``cat a.gz b.gz``) are read as one, as ``bz2.open`` and ``gzip.open`` read them, and
    bytes after the last stream that start no new one are ignored, as ``bz2.open`` ignores them
    (``gzip.open`` ignores zero padding there)."""
    if path.endswith(".bz2"):
        new = bz2.BZ2Decompressor
    elif path.endswith(".gz"):
        new = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)  # noqa: E731 - the gzip header
    else:
        while True:
            data = f.read(block)
            if not data:
                return
            yield data
    d, fed, later, pending = new(), False, False, b""
    while True:
        data = pending or f.read(block)
        pending = b""
        if not data:
            break
        if d.eof:       # the stream before ended: what follows starts another
            d, fed, later = new(), False, True
        try:
            out = d.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            if later and not fed:
                return  # trailing bytes that are no stream
            raise OSError(f"corrupt compressed data ({e})") from None
        fed = True
        yield out
        if d.eof:
            pending = d.unused_data
    if fed and not d.eof:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")


def _key(path) -> str:
    return os.path.abspath(os.fspath(path))


def start(path) -> None:
    """Begin reading ``path`` now, for a later :func:`take` of the same path."""
    with _lock:
        old = _started.pop(_key(path), None)
        if old is not None:
            old.close()
        _started[_key(path)] = ReadAhead(path)


def take(path) -> ReadAhead:
    """The reader :func:`start` began for ``path``, or a new one; either way the caller owns it."""
    with _lock:
        reader: Optional[ReadAhead] = _started.pop(_key(path), None)
    return reader if reader is not None else ReadAhead(path)
