"""solvers.checks.first_not_finite, chunk by chunk, against a whole-array numpy test."""
import numpy as np
import pytest

from solvers import checks


@pytest.mark.parametrize("shape", [(10,), (10, 2), (10, 3, 2)])
def test_first_not_finite_is_the_first_bad_row_across_chunks(monkeypatch, shape):
    monkeypatch.setattr(checks, "_CHUNK_ROWS", 3)        # rows 0-2, 3-5, 6-8, 9
    rng = np.random.default_rng(0)
    for bad_rows in ([], [9], [4, 7], [0, 1], [5]):
        a = rng.standard_normal(shape)
        for r, v in zip(bad_rows, (np.nan, np.inf, -np.inf)):
            a.reshape(shape[0], -1)[r, -1] = v
        want = np.flatnonzero(~np.isfinite(a.reshape(shape[0], -1)).all(axis=1))
        assert checks.first_not_finite(a) == (int(want[0]) if want.size else None)


def test_integers_and_empty_arrays_are_finite():
    assert checks.first_not_finite(np.arange(5)) is None
    assert checks.first_not_finite(np.zeros((0, 2))) is None
