"""Progress bars of long reads (solvers.io.progress): on a terminal after the delay, never in a pipe."""
import io

import numpy as np

import solvers
from solvers.io import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_shows_on_a_terminal_and_not_in_a_pipe(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    term, pipe = _Terminal(), io.StringIO()
    for stream in (term, pipe):
        with progress.bar(1000, "reading x", stream=stream) as bar:
            bar.update(1000)
    assert "reading x" in term.getvalue()
    assert pipe.getvalue() == ""


def test_reading_a_bal_file_in_a_pipe_prints_nothing(tmp_path, capfd):
    p = solvers.synthetic_problem(5, 50, 4, seed=0)
    path = tmp_path / "p.txt"
    solvers.write_bal(p, str(path))
    capfd.readouterr()
    q = solvers.read_bal(str(path))
    assert np.array_equal(q.observations, p.observations)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
