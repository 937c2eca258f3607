"""Progress bars for reading large inputs: shown on a terminal once the work has taken more than
a second (tqdm's ``delay``), never in a pipe or a log file, so short reads and scripts stay
quiet."""
from __future__ import annotations

import sys


DELAY_S = 1.0     # a read that ends sooner shows nothing


def _is_terminal(stream) -> bool:
    return bool(getattr(stream, "isatty", None)) and stream.isatty()


class _Quiet:
    """What :func:`bar` gives where nothing is shown: the calls a read makes, doing nothing (so a
    script or a pipe never imports tqdm)."""

    def update(self, n=1):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def bar(total=None, desc: str = "", unit: str = "B", stream=None):
    """A tqdm bar on ``stream`` (default: stderr) when it is a terminal, else a bar that shows
    nothing. Bytes are shown scaled (kB, MB); other units as counts."""
    stream = sys.stderr if stream is None else stream
    if not _is_terminal(stream):
        return _Quiet()
    from tqdm import tqdm      # only for a terminal: tqdm costs ~80 ms to import
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", delay=DELAY_S, file=stream,
                leave=False)
