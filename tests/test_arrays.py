"""clkernels.arrays.upload: large arrays through pinned staging buffers, converted on the way."""
import numpy as np
import pytest

from clkernels import arrays


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "one-write"])
@pytest.mark.parametrize("src, dtype", [
    (np.arange(-50_000, 50_003, dtype=np.int64), np.int32),           # BAL indices, int64 -> int32
    (np.linspace(-3, 3, 2 * 40_001).reshape(-1, 2), np.float32),      # observations to float32
    (np.linspace(-3, 3, 2 * 40_001).reshape(-1, 2), None),            # as they are
])
def test_upload_gives_what_astype_gives(device, monkeypatch, staged, src, dtype):
    """Every chunk lands at its place (chunks of 4 KiB: many, and a short last one; the two
    staging buffers reused in turn), converted as ``astype`` converts, on a real device."""
    monkeypatch.setattr(arrays, "STAGED_UPLOAD", staged)
    monkeypatch.setattr(arrays, "STAGED_UPLOAD_MIN_BYTES", 1)
    monkeypatch.setattr(arrays, "STAGE_CHUNK_BYTES", 4096)
    out = arrays.upload(device, src, dtype)
    want = src.astype(dtype) if dtype is not None else src
    assert out.shape == want.shape and out.dtype == want.dtype
    np.testing.assert_array_equal(out.get(), want)


def test_a_small_array_takes_one_write(device, monkeypatch):
    monkeypatch.setattr(arrays, "STAGED_UPLOAD", True)
    src = np.arange(10, dtype=np.int64)
    np.testing.assert_array_equal(arrays.upload(device, src, np.int32).get(), src)
    np.testing.assert_array_equal(arrays.upload(device, np.zeros(0)).get(), np.zeros(0))
