"""solvers.ba.ordering and the preparation built on it against the plain numpy definitions
(``np.argsort(kind="stable")``, ``np.searchsorted``, ``np.bincount``): same values, on random
data and the edge cases (no observations, one camera, unobserved cameras and points, a point
seen twice by one camera, unsorted input)."""
import numpy as np
import pytest

import solvers
import solvers.ba.ordering as ordering
import solvers.linalg.schur_pcg_device as schur_pcg
from solvers.ba.evaluator import Evaluator
from solvers.models.snavely import SnavelyModel


@pytest.fixture(autouse=True)
def bucketed_sorts(monkeypatch):
    """The bucketed sorts even for these small inputs (numpy's sort takes over below SMALL)."""
    monkeypatch.setattr(ordering, "SMALL", 0)


def test_small_inputs_sort_as_numpy_does(monkeypatch):
    monkeypatch.setattr(ordering, "SMALL", 1 << 18)
    keys = np.random.default_rng(0).integers(0, 50, 1000)
    got = ordering.stable_order(keys, 50)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def _reference_segments(cam, pt, nc, max_len):
    """schur_pcg._camera_segments as it was first written: argsort, gathers, searchsorted."""
    n = cam.size
    order = np.argsort(cam, kind="stable")
    c, p = cam[order], pt[order]
    group_start = np.flatnonzero(np.concatenate(([True], (c[1:] != c[:-1]) | (p[1:] != p[:-1])))) \
        if n else np.zeros(0, np.int64)
    group_start = np.concatenate((group_start, [n]))
    counts = np.bincount(cam, minlength=nc)
    pieces = -(-counts // max_len)
    cam_seg = np.concatenate(([0], np.cumsum(pieces)))
    first_obs = np.concatenate(([0], np.cumsum(counts)))
    owner = np.repeat(np.arange(nc), pieces)
    k = np.arange(owner.size) - cam_seg[owner]
    want = first_obs[owner] + k * max_len
    start = np.minimum(group_start[np.searchsorted(group_start, want)], first_obs[owner + 1])
    return order, np.concatenate((start, [n])), cam_seg


def _keys(rng, kind, n, bound):
    if kind == "random":
        return rng.integers(0, bound, n)
    if kind == "sorted":
        return np.sort(rng.integers(0, bound, n))
    if kind == "reversed":
        return np.sort(rng.integers(0, bound, n))[::-1].copy()
    if kind == "constant":
        return np.full(n, bound - 1)
    if kind == "few-distinct":
        return rng.choice(rng.integers(0, bound, 3), n)
    raise ValueError(kind)


KINDS = ["random", "sorted", "reversed", "constant", "few-distinct"]
# Bounds on both sides of the one-pass (8-bit), radix (24-bit) and comparison-sort (wider) cases.
BOUNDS = [1, 2, 255, 256, 257, 13682, 65536, 65537, 4460000, 1 << 24, (1 << 24) + 1, 1 << 30]


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_stable_order_is_numpys_stable_argsort(bound, kind, dtype):
    rng = np.random.default_rng(bound % 1000 + 7 * KINDS.index(kind))
    for n in (0, 1, 2, 1000, 70000):
        keys = _keys(rng, kind, n, bound).astype(dtype)
        got = ordering.stable_order(keys, bound)
        assert got.dtype == np.int32
        assert np.array_equal(got, np.argsort(keys, kind="stable")), (bound, kind, n)


def test_stable_order_over_many_chunks_and_threads(monkeypatch):
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 4460000, 300000)
    want = np.argsort(keys, kind="stable")
    monkeypatch.setattr(ordering, "CHUNK", 4096)
    for t in (1, 3):
        monkeypatch.setattr(ordering, "threads", lambda: t)
        assert np.array_equal(ordering.stable_order(keys, 4460000), want)
        assert np.array_equal(ordering.stable_order(np.sort(keys), 4460000), np.arange(keys.size))
    assert np.array_equal(ordering.stable_order(keys, 4460000, dtype=np.int64), want)


def test_sort_within_sorts_each_range_stably(monkeypatch):
    rng = np.random.default_rng(5)
    for chunk, t in ((1 << 20, 1), (64, 3)):
        monkeypatch.setattr(ordering, "CHUNK", chunk)
        monkeypatch.setattr(ordering, "threads", lambda: t)
        for n, nranges, dtype in ((0, 1, np.uint16), (1, 1, np.uint16), (500, 1, np.int64),
                                  (3000, 40, np.uint16), (3000, 3000, np.int32), (20000, 7, np.uint16)):
            cuts = np.sort(rng.integers(0, n + 1, nranges - 1))
            starts = np.concatenate(([0], cuts, [n]))         # empty ranges among them
            keys = rng.integers(0, 6, n).astype(dtype)
            values = rng.standard_normal((2, n))
            seg = np.repeat(np.arange(nranges), np.diff(starts))
            order = np.lexsort((np.arange(n), keys, seg))
            got = ordering.sort_within(starts, keys, values[0], values[1].astype(np.float32))
            assert got[0].dtype == keys.dtype and got[2].dtype == np.float32
            assert np.array_equal(got[0], keys[order])
            assert np.array_equal(got[1], values[0][order])
            assert np.array_equal(got[2], values[1].astype(np.float32)[order])


def test_sortedness_checks(monkeypatch):
    monkeypatch.setattr(ordering, "CHUNK", 5)
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 5, 6, 11, 50):
        for _ in range(20):
            a = np.sort(rng.integers(0, 4, n))
            b = rng.integers(0, 4, n)
            if n > 1 and rng.random() < 0.5:
                i = rng.integers(1, n)
                a[i] = a[i - 1] - 1
            assert ordering.is_sorted(a) == bool(np.all(a[1:] >= a[:-1]))
            lex = np.lexsort((b, a))
            assert ordering.is_sorted_by(a, b) == np.array_equal(lex, np.arange(n))
            order = np.lexsort((b, a))
            assert ordering.is_sorted_by(a[order], b[order])


def test_counts_and_starts(monkeypatch):
    monkeypatch.setattr(ordering, "CHUNK", 7)
    rng = np.random.default_rng(1)
    for n, bound in ((0, 0), (0, 5), (1, 1), (100, 3), (1000, 5000), (5000, 40)):
        keys = rng.integers(0, max(bound, 1), n) if bound else np.zeros(0, np.int64)
        assert np.array_equal(ordering.counts(keys, bound), np.bincount(keys, minlength=bound))
        s = np.sort(keys).astype(np.int32)
        want = np.concatenate((np.searchsorted(s, np.arange(bound)), [n]))
        assert np.array_equal(ordering.starts(s, bound), want)
        assert np.array_equal(ordering.starts(keys, bound), want)      # unsorted: the same


def test_inverse_permutation_take_and_changes(monkeypatch):
    monkeypatch.setattr(ordering, "CHUNK", 64)
    rng = np.random.default_rng(2)
    for n in (0, 1, 63, 64, 65, 1000):
        p = rng.permutation(n)
        assert np.array_equal(ordering.inverse_permutation(p), np.argsort(p))
        rows = rng.standard_normal((n, 2))
        assert np.array_equal(ordering.take(rows, p), rows[p])
        ints = rng.integers(0, 5, n)
        got = ordering.take(ints, p.astype(np.int32), dtype=np.int32)
        assert got.dtype == np.int32 and np.array_equal(got, ints[p])
        v = ints[p]
        assert np.array_equal(ordering.changes(ints, p), np.concatenate(([True], v[1:] != v[:-1]))[:n])


def test_empty_and_columns(monkeypatch):
    monkeypatch.setattr(ordering, "CHUNK", 3)
    rng = np.random.default_rng(7)
    for n in (0, 1, 5, 40):
        e = ordering.empty((n, 3), np.int32)
        assert e.shape == (n, 3) and e.dtype == np.int32
        a, b = rng.integers(0, 1000, n), rng.integers(0, 1000, n).astype(np.int32)
        got = ordering.columns([a, b], np.int32)
        assert got.dtype == np.int32 and np.array_equal(got, np.stack([a, b], axis=1).astype(np.int32))
    with pytest.raises(ValueError, match="different lengths"):
        ordering.columns([np.zeros(3), np.zeros(4)], np.int32)


def test_converted_is_ascontiguousarray(monkeypatch):
    """Chunks of 4 * 3 elements on threads; strided and already-converted inputs."""
    monkeypatch.setattr(ordering, "CHUNK", 3)
    monkeypatch.setattr(ordering, "SMALL", 0)
    rng = np.random.default_rng(8)
    for n in (0, 1, 11, 12, 13, 100):
        a = rng.integers(-1000, 1000, (n, 2))
        for src in (a[:, 0], a[:, 1].copy(), a.ravel()):
            got = ordering.converted(src, np.int32)
            want = np.ascontiguousarray(src, np.int32)
            assert got.dtype == want.dtype and got.flags.c_contiguous and np.array_equal(got, want)
    same = np.arange(50, dtype=np.int32)
    assert ordering.converted(same, np.int32) is same


def test_next_true():
    rng = np.random.default_rng(4)
    for n in (0, 1, 2, 10, 500):
        for density in (0.0, 0.05, 0.5, 0.95, 1.0):
            mask = rng.random(n) < density
            pos = rng.integers(0, n + 1, 50) if n else np.zeros(3, np.int64)
            t = np.concatenate((np.flatnonzero(mask), [n]))
            assert np.array_equal(ordering.next_true(mask, pos), t[np.searchsorted(t, pos)])


def _observations(rng, nc, npt, n, twice=0, shuffle=True):
    """``n`` observations of ``npt`` points by ``nc`` cameras, ``twice`` of them repeating a
    (camera, point) pair; in camera-then-point order unless ``shuffle``."""
    cam, pt = rng.integers(0, nc, n), rng.integers(0, npt, n)
    if twice and n:
        i = rng.integers(0, n, twice)
        cam, pt = np.concatenate((cam, cam[i])), np.concatenate((pt, pt[i]))
    if shuffle:
        p = rng.permutation(cam.size)
    else:
        p = np.lexsort((pt, cam))
    return cam[p], pt[p]


SEGMENT_CASES = {
    # name: (cameras, points, observations, repeated pairs)
    "empty": (3, 4, 0, 0),
    "one-camera": (1, 50, 400, 0),
    "one-observation": (5, 1, 1, 0),
    "unobserved-cameras": (40, 30, 60, 0),
    "seen-twice": (6, 20, 300, 80),
    "long-runs-of-one-point": (2, 2, 700, 400),
    "random": (30, 500, 4000, 30),
}


@pytest.mark.parametrize("case", list(SEGMENT_CASES))
@pytest.mark.parametrize("max_len", [1, 2, 3, 16, 256])
def test_camera_segments_match_the_first_definition(case, max_len):
    nc, npt, n, twice = SEGMENT_CASES[case]
    rng = np.random.default_rng(len(case) * 31 + max_len)
    cam, pt = _observations(rng, nc, npt, n, twice)
    order = np.argsort(pt, kind="stable")
    cam, pt = cam[order], pt[order]                 # point order, as DevicePCG gets them
    want = _reference_segments(cam, pt, nc, max_len)
    for given in (None, np.argsort(cam, kind="stable").astype(np.int32)):
        got = schur_pcg._camera_segments(cam.astype(np.int32), pt.astype(np.int32), nc, max_len, given)
        for g, w in zip(got, want):
            assert np.array_equal(g, w), case


class _NoModel:
    """A model class that only records what the Evaluator hands it."""

    def __init__(self, cam, pt, observations, dtype=None, device=None):
        self.cam, self.pt, self.observations = cam, pt, observations


@pytest.mark.parametrize("layout", ["camera-then-point", "point", "shuffled"])
@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_evaluator_orders(case, layout):
    nc, npt, n, twice = SEGMENT_CASES[case]
    rng = np.random.default_rng(len(case) + len(layout))
    cam, pt = _observations(rng, nc, npt, n, twice, shuffle=layout == "shuffled")
    if layout == "point":
        p = np.argsort(pt, kind="stable")
        cam, pt = cam[p], pt[p]
    obs = rng.standard_normal((cam.size, 2))
    problem = solvers.BALProblem(np.zeros((nc, 9)), np.zeros((npt, 3)), cam, pt, obs)
    ev = Evaluator(problem, solvers.Loss(), model=_NoModel)
    order = np.argsort(pt, kind="stable")
    assert np.array_equal(ev.order, order)
    assert np.array_equal(ev.cam, cam[order]) and np.array_equal(ev.pt, pt[order])
    assert np.array_equal(ev.model.cam, cam[order]) and np.array_equal(ev.model.pt, pt[order])
    assert np.array_equal(ev.model.observations, obs[order])
    assert np.array_equal(ev.camera_order(), np.argsort(cam[order], kind="stable"))
    assert ev.camera_order() is ev.camera_order()


def test_snavely_model_index_is_the_stacked_int32_index():
    rng = np.random.default_rng(5)
    cam, pt = rng.integers(0, 7, 100), rng.integers(0, 1000, 100)
    model = SnavelyModel(cam, pt, rng.standard_normal((100, 2)), backend="numpy")
    want = np.stack([cam, pt], axis=1).astype(np.int32)
    assert model._host[0].dtype == np.int32 and np.array_equal(model._host[0], want)


def test_device_pcg_index_arrays(device):
    """DevicePCG's index arrays, with and without the Evaluator's camera order, against the
    first definition's (argsort, searchsorted)."""
    if not device.info.fp64:
        pytest.skip("the device CG needs fp64")
    rng = np.random.default_rng(6)
    nc, npt = 9, 300
    cam, pt = _observations(rng, nc, npt, 2000, twice=40, shuffle=False)
    problem = solvers.BALProblem(np.zeros((nc, 9)), np.zeros((npt, 3)), cam, pt, np.zeros((cam.size, 2)))
    ev = Evaluator(problem, solvers.Loss(), model=_NoModel)
    max_len = schur_pcg.MAX_SEGMENT_CPU if device.info.is_cpu else schur_pcg.MAX_SEGMENT_GPU
    order, seg_start, cam_seg = _reference_segments(ev.cam.astype(np.int64), ev.pt.astype(np.int64), nc, max_len)
    pt_start = np.concatenate((np.searchsorted(ev.pt, np.arange(npt)), [ev.pt.size]))
    for given in (None, ev.camera_order()):
        pcg = schur_pcg.DevicePCG(device, ev.cam, ev.pt, nc, npt, camera_order=given)
        for dev, want in ((pcg.obs, order), (pcg.seg_start, seg_start), (pcg.cam_seg, cam_seg),
                          (pcg.pt_start, pt_start), (pcg.cam, ev.cam), (pcg.pt, ev.pt)):
            assert np.array_equal(dev.get(), want)


def test_angle_axis_from_matrix_equals_scipys():
    """solvers.models.rotation.angle_axis_from_matrix (numpy, for the synthetic problems) against scipy's
    Rotation on random rotations, tiny ones and ones near pi."""
    from scipy.spatial.transform import Rotation
    from solvers.models.rotation import angle_axis_from_matrix
    rng = np.random.default_rng(0)
    axes = rng.normal(size=(200, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    for w in (Rotation.random(5000, random_state=1).as_rotvec(), rng.normal(0, 1e-6, (200, 3)),
              np.pi * (1 - 1e-9) * axes, np.zeros((1, 3))):
        M = Rotation.from_rotvec(w).as_matrix()
        np.testing.assert_allclose(angle_axis_from_matrix(M), Rotation.from_matrix(M).as_rotvec(), rtol=0, atol=1e-15)
