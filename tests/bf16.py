"""bfloat16 in the tests: ml_dtypes' dtype, and the closeness the docs state for it (guides/vision-ops.md)."""
import numpy as np
import ml_dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)


def round_bf16(a) -> np.ndarray:
    """float64 values rounded to bfloat16 as a store does (nearest, ties to even), as float64."""
    return np.asarray(a, np.float64).astype(np.float32).astype(BF16).astype(np.float64)


def bf16_off(actual, expected, rel_sums=1e-5) -> np.ndarray:
    """Where ``actual`` (bfloat16) is not the float64 ``expected`` rounded to bfloat16, give or
    take one bfloat16 unit in the last place (the kernel's float sums can put a value on the
    other side of a rounding boundary), plus ``rel_sums`` of the largest value (float rounding of
    sums whose terms are the size of the largest)."""
    a, e = np.asarray(actual).astype(np.float64), np.asarray(expected, np.float64)
    r = round_bf16(e)
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(r), np.finfo(np.float32).tiny))) - 7)
    scale = np.abs(e).max() if e.size else 1.0
    return np.abs(a - r) > ulp + rel_sums * scale


def assert_bf16_close(actual, expected, rel_sums=1e-5, what="", also=None):
    """``actual`` is bfloat16 and no value is :func:`bf16_off` ``expected`` (or, where
    ``also`` is given, off both: a derivative at a kink may take either side's value)."""
    actual = np.asarray(actual)
    assert actual.dtype == BF16, f"{what}: dtype {actual.dtype}, expected bfloat16"
    bad = bf16_off(actual, expected, rel_sums)
    if also is not None:
        bad &= bf16_off(actual, also, rel_sums)
    e = np.asarray(expected, np.float64)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} values off by more than one bfloat16 "
                           f"ulp, e.g. {actual.astype(np.float64)[bad][:3]} against {e[bad][:3]}")
