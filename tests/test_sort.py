"""clkernels.sort against numpy: stable_order (np.argsort kind="stable"), counts (np.bincount),
starts, exclusive_scan (np.cumsum), inverse_permutation and take, on random and adversarial
inputs (sorted, reversed, all equal, bound much larger than n, one huge key class, lengths that
are no multiple of a tile), with the device's configuration and small ones that make many tiles
and work-groups of several items out of a few hundred elements. Tests marked ``oclgrind`` run
clean on the simulator (tiny shapes)."""
import numpy as np
import pyopencl.array as cla
import pytest

import clkernels.templates as templates
from clkernels import sort
from clkernels.sort import Config

# Beside the device's own: many tiles of several work-items (4-bit and 8-bit digits, K no power
# of two), one work-item per group, and the GPUs' configuration (on CPUs it checks that path).
SMALL_CONFIGS = [Config(4, 8, 4, 8), Config(8, 5, 8, 4), Config(1, 64, 8, 32)]
GPU_CONFIG = Config(256, 16, 4, 16)


def _configs(device):
    configs = [None] + SMALL_CONFIGS
    if not device.info.is_simulator:
        configs.append(GPU_CONFIG)
    return configs


def _keys(rng, kind, n, bound):
    if kind == "random":
        return rng.integers(0, bound, n)
    if kind == "sorted":
        return np.sort(rng.integers(0, bound, n))
    if kind == "reversed":
        return np.sort(rng.integers(0, bound, n))[::-1]
    if kind == "constant":
        return np.full(n, bound - 1)
    if kind == "one-huge-class":      # 90% one key, the rest spread thin
        keys = rng.integers(0, bound, n)
        keys[rng.random(n) < 0.9] = bound // 3
        return keys
    if kind == "camera-major":        # point indices of observations sorted by camera
        cams = np.sort(rng.integers(0, 50, n))
        return np.lexsort((rng.integers(0, bound, n), cams)) % bound
    raise ValueError(kind)


KINDS = ["random", "sorted", "reversed", "constant", "one-huge-class", "camera-major"]


def _bincount(keys, bound):
    return np.bincount(keys, minlength=bound).astype(np.int32)


def _starts(keys, bound):
    return np.concatenate(([0], np.cumsum(_bincount(keys, bound)))).astype(np.int32)


def _device(rt, a):
    return cla.to_device(rt.queue, np.ascontiguousarray(a))


# ------------------------------------------------------------------------------ stable_order

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,bound", [(0, 5), (1, 1), (2, 2), (37, 3), (1000, 7), (4099, 1000),
                                     (5000, 1 << 30), (20_011, 70_000)])
def test_stable_order_matches_numpy(device, kind, n, bound):
    rng = np.random.default_rng(n + bound)
    keys = _keys(rng, kind, n, bound).astype(np.int32)
    want = np.argsort(keys, kind="stable")
    for config in _configs(device):
        got = sort.stable_order(device, _device(device, keys), bound, config=config)
        assert isinstance(got, cla.Array) and got.dtype == np.int32
        np.testing.assert_array_equal(got.get(), want, err_msg=f"config {config}")


@pytest.mark.parametrize("kind", ["random", "camera-major", "one-huge-class"])
def test_stable_order_millions(device, kind):
    n, bound = 3_000_017, 1_000_003
    keys = _keys(np.random.default_rng(1), kind, n, bound).astype(np.int32)
    got = sort.stable_order(device, keys, bound)          # numpy in, numpy out
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def test_stable_order_realistic_point_indices(device):
    import solvers
    bal = solvers.synthetic_problem(60, 60_000, 5.07, seed=1)
    keys = bal.point_index.astype(np.int32)
    got = sort.stable_order(device, keys, bal.num_points)
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def test_stable_order_same_bits_every_run_and_configuration(device):
    keys = np.random.default_rng(2).integers(0, 5000, 300_001).astype(np.int32)
    keys_dev = _device(device, keys)
    runs = [sort.stable_order(device, keys_dev, 5000).get() for _ in range(2)]
    runs += [sort.stable_order(device, keys_dev, 5000, config=c).get() for c in _configs(device)[1:]]
    for r in runs[1:]:
        assert r.tobytes() == runs[0].tobytes()


def test_stable_order_largest_keys(device):
    keys = np.array([2 ** 31 - 1, 0, 2 ** 31 - 1, 5, 2 ** 30], np.int32)
    np.testing.assert_array_equal(sort.stable_order(device, keys, 2 ** 31),
                                  np.argsort(keys, kind="stable"))


def test_bad_keys_raise_when_checked_and_never_write_out_of_bounds(device):
    keys = np.array([3, -1, 7, 2, 9, 0, 2 ** 31 - 1], np.int32)
    with pytest.raises(ValueError, match="outside"):
        sort.stable_order(device, keys, 8, check=True)
    for config in _configs(device):
        # Unchecked: a permutation still (sorted by the bits a bound of 8 reads).
        got = sort.stable_order(device, keys, 8, config=config)
        np.testing.assert_array_equal(got, np.argsort(keys & 7, kind="stable"))
    with pytest.raises(ValueError, match="outside"):
        sort.counts(device, keys, 8, check=True)
    np.testing.assert_array_equal(sort.counts(device, keys, 8), _bincount(keys[(keys >= 0) & (keys < 8)], 8))
    with pytest.raises(ValueError, match="outside"):
        sort.starts(device, keys, 8, check=True)
    ok = np.array([0, 7, 3], np.int32)
    np.testing.assert_array_equal(sort.stable_order(device, ok, 8, check=True), np.argsort(ok, kind="stable"))


def test_arguments_are_checked(device):
    with pytest.raises(TypeError, match="int32"):
        sort.stable_order(device, np.arange(5, dtype=np.int64), 5)
    with pytest.raises(ValueError, match="bound"):
        sort.counts(device, np.arange(5, dtype=np.int32), -1)
    with pytest.raises(ValueError, match="dimensions"):
        sort.stable_order(device, np.zeros((2, 2), np.int32), 5)


def test_new_sizes_build_no_new_program(device):
    rng = np.random.default_rng(3)
    run = lambda n, bound: (sort.stable_order(device, rng.integers(0, bound, n).astype(np.int32), bound),  # noqa: E731
                            sort.starts(device, rng.integers(0, bound, n).astype(np.int32), bound),
                            sort.inverse_permutation(device, rng.permutation(n).astype(np.int32)))
    run(1000, 300)
    before = len(templates._programs)
    run(12_345, 100_000)
    run(77, 2)
    assert len(templates._programs) == before


# ------------------------------------------------------------------------- counts and starts

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,bound", [(0, 0), (0, 4), (1, 1), (999, 3), (10_007, 100_000), (2_000_003, 5000)])
def test_counts_and_starts_match_numpy(device, kind, n, bound):
    keys = _keys(np.random.default_rng(n), kind, n, max(bound, 1)).astype(np.int32) if bound else \
        np.zeros(0, np.int32)
    for config in (None, SMALL_CONFIGS[0]):
        c = sort.counts(device, _device(device, keys), bound, config=config)
        s = sort.starts(device, _device(device, keys), bound, config=config)
        assert c.dtype == s.dtype == np.int32
        np.testing.assert_array_equal(c.get(), _bincount(keys, bound))
        np.testing.assert_array_equal(s.get(), _starts(keys, bound))
        np.testing.assert_array_equal(sort.exclusive_scan(device, c, total=True).get(), _starts(keys, bound))


# ---------------------------------------------------------------------------------- scans

@pytest.mark.parametrize("n", [0, 1, 2, 31, 32, 33, 4095, 4096, 4097, 70_001, 3_000_000])
def test_exclusive_scan_matches_cumsum(device, n):
    a = np.random.default_rng(n).integers(-1000, 1000, n).astype(np.int32)
    inclusive = np.cumsum(a, dtype=np.int32)
    for config in [None, SMALL_CONFIGS[0], SMALL_CONFIGS[2]]:
        got = sort.exclusive_scan(device, _device(device, a), config=config).get()
        np.testing.assert_array_equal(got, np.concatenate(([0], inclusive[:-1])) if n else a)
        got = sort.exclusive_scan(device, a, total=True, config=config)
        np.testing.assert_array_equal(got, np.concatenate(([0], inclusive)))


def test_exclusive_scan_wraps_as_int32(device):
    a = np.full(10, 2 ** 30, np.int32)
    np.testing.assert_array_equal(sort.exclusive_scan(device, a, total=True),
                                  np.concatenate(([0], np.cumsum(a, dtype=np.int32))))


# ------------------------------------------------------------------- permutations and take

@pytest.mark.parametrize("n", [0, 1, 2, 1000, 1_000_003])
def test_inverse_permutation(device, n):
    p = np.random.default_rng(n).permutation(n).astype(np.int32)
    got = sort.inverse_permutation(device, _device(device, p))
    np.testing.assert_array_equal(got.get(), np.argsort(p))
    with pytest.raises(ValueError, match="outside"):
        sort.inverse_permutation(device, np.array([0, 2, 5], np.int32), check=True)


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64])
@pytest.mark.parametrize("width", [None, 1, 2, 3, 4, 5, 8, 16])
def test_take_matches_numpy(device, dtype, width):
    rng = np.random.default_rng(width or 0)
    rows = 1000
    shape = (rows,) if width is None else (rows, width)
    a = (rng.standard_normal(shape) * 1000).astype(dtype)
    idx = rng.integers(0, rows, 3001).astype(np.int32)
    np.testing.assert_array_equal(sort.take(device, a, idx), np.take(a, idx, axis=0))
    got = sort.take(device, _device(device, a), _device(device, idx))
    assert isinstance(got, cla.Array)
    np.testing.assert_array_equal(got.get(), a[idx])
    out = cla.empty(device.queue, (idx.size,) + shape[1:], dtype)
    assert sort.take(device, _device(device, a), _device(device, idx), out=out) is out
    np.testing.assert_array_equal(out.get(), a[idx])
    host_out = np.empty((idx.size,) + shape[1:], dtype)
    assert sort.take(device, a, idx, out=host_out) is host_out
    np.testing.assert_array_equal(host_out, a[idx])


def test_take_edges(device):
    a = np.arange(12, dtype=np.float64).reshape(6, 2)
    assert sort.take(device, a, np.zeros(0, np.int32)).shape == (0, 2)
    bad = np.array([1, -3, 9], np.int32)
    np.testing.assert_array_equal(sort.take(device, a, bad), np.take(a, bad, axis=0, mode="clip"))
    with pytest.raises(ValueError, match="outside"):
        sort.take(device, a, bad, check=True)
    with pytest.raises(ValueError, match="rows of 1 to 16"):
        sort.take(device, np.zeros((3, 17), np.float32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="empty"):
        sort.take(device, np.zeros((0, 2), np.float32), np.zeros(2, np.int32))


# ------------------------------------------------------------------ the simulator's shapes

@pytest.mark.oclgrind
@pytest.mark.parametrize("kind", ["random", "reversed", "one-huge-class"])
def test_tiny_stable_order(device, kind):
    rng = np.random.default_rng(5)
    for n, bound in [(1, 1), (300, 1), (300, 17), (301, 5000)]:
        keys = _keys(rng, kind, n, bound).astype(np.int32)
        for config in [None, GPU_CONFIG] + SMALL_CONFIGS:
            got = sort.stable_order(device, keys, bound, config=config)
            np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"), err_msg=f"{config}")
    bad = np.array([3, -1, 7, 40], np.int32)
    with pytest.raises(ValueError):
        sort.stable_order(device, bad, 8, check=True)
    np.testing.assert_array_equal(sort.stable_order(device, bad, 8), np.argsort(bad & 7, kind="stable"))


@pytest.mark.oclgrind
def test_tiny_counts_starts_scan(device):
    keys = _keys(np.random.default_rng(6), "random", 257, 40).astype(np.int32)
    for config in (None, GPU_CONFIG, SMALL_CONFIGS[0]):
        np.testing.assert_array_equal(sort.counts(device, keys, 40, config=config), _bincount(keys, 40))
        np.testing.assert_array_equal(sort.starts(device, keys, 40, config=config), _starts(keys, 40))
        np.testing.assert_array_equal(sort.exclusive_scan(device, keys, total=True, config=config),
                                      np.concatenate(([0], np.cumsum(keys))))
    np.testing.assert_array_equal(sort.starts(device, np.zeros(0, np.int32), 0), [0])


@pytest.mark.oclgrind
def test_tiny_inverse_permutation_and_take(device):
    rng = np.random.default_rng(7)
    p = rng.permutation(300).astype(np.int32)
    np.testing.assert_array_equal(sort.inverse_permutation(device, p), np.argsort(p))
    for dtype, width in [(np.int32, None), (np.float32, 3), (np.float64, 2), (np.float64, 5)]:
        a = rng.standard_normal((50,) if width is None else (50, width)).astype(dtype)
        idx = rng.integers(0, 50, 200).astype(np.int32)
        np.testing.assert_array_equal(sort.take(device, a, idx), a[idx])


@pytest.mark.oclgrind
@pytest.mark.parametrize("n", [0, 1, 257])
def test_stack_pairs_matches_numpy(device, n):
    rng = np.random.default_rng(n)
    a = rng.integers(-5, 1000, n).astype(np.int32)
    b = rng.integers(-5, 1000, n).astype(np.int32)
    np.testing.assert_array_equal(sort.stack_pairs(device, a, b), np.stack((a, b), axis=1))
    got = sort.stack_pairs(device, cla.to_device(device.queue, a), cla.to_device(device.queue, b))
    assert got.shape == (n, 2)
    np.testing.assert_array_equal(got.get(), np.stack((a, b), axis=1))
    with pytest.raises(ValueError, match="one shape"):
        sort.stack_pairs(device, a, np.zeros(n + 1, np.int32))


def _run_starts(a, b=None):
    """Where each run of equal a (or (a, b) rows) begins, from the definition."""
    if not a.size:
        return np.zeros(0, np.int64)
    change = a[1:] != a[:-1]
    if b is not None:
        change |= b[1:] != b[:-1]
    return np.flatnonzero(np.concatenate(([True], change)))


@pytest.mark.oclgrind
@pytest.mark.parametrize("n", [0, 1, 2, 33, 300])
def test_tiny_run_starts(device, n):
    rng = np.random.default_rng(n)
    a = np.sort(rng.integers(0, 4, n)).astype(np.int32)
    b = rng.integers(0, 3, n).astype(np.int32)
    np.testing.assert_array_equal(sort.run_starts(device, a), _run_starts(a))
    np.testing.assert_array_equal(sort.run_starts(device, a, b), _run_starts(a, b))
    got = sort.run_starts(device, _device(device, a), _device(device, b))
    assert isinstance(got, cla.Array) and got.dtype == np.int32
    np.testing.assert_array_equal(got.get(), _run_starts(a, b))
    with pytest.raises(ValueError, match="one shape"):
        sort.run_starts(device, a, np.zeros(n + 1, np.int32))


@pytest.mark.parametrize("kind", ["random", "constant", "camera-major"])
def test_run_starts_matches_numpy(device, kind):
    rng = np.random.default_rng(7)
    n = 100_003
    a = _keys(rng, kind, n, 50).astype(np.int32)
    b = _keys(rng, "sorted", n, 9).astype(np.int32)
    for config in [None, SMALL_CONFIGS[0]]:
        np.testing.assert_array_equal(sort.run_starts(device, a, b, config=config), _run_starts(a, b))
        np.testing.assert_array_equal(sort.run_starts(device, a, config=config), _run_starts(a))
