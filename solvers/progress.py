"""Progress bars for reading large inputs: shown on a terminal once the work has taken more than
a second (tqdm's ``delay``), never in a pipe or a log file, so short reads and scripts stay
quiet."""
from __future__ import annotations

import sys

from tqdm import tqdm

DELAY_S = 1.0     # a read that ends sooner shows nothing


def _is_terminal(stream) -> bool:
    return bool(getattr(stream, "isatty", None)) and stream.isatty()


def bar(total=None, desc: str = "", unit: str = "B", stream=None) -> tqdm:
    """A tqdm bar on ``stream`` (default: stderr), disabled unless it is a terminal. Bytes are
    shown scaled (kB, MB); other units as counts."""
    stream = sys.stderr if stream is None else stream
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", delay=DELAY_S, file=stream,
                disable=not _is_terminal(stream), leave=False)
