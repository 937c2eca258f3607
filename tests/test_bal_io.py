"""BAL reader/writer, validation errors, synthetic problems, PLY output and the download helper.

References are independent: the numbers in shared/data/bal/README.md, a Python per-line parser,
the numpy Snavely reference, and the camera-centre definition R c + t = 0.
"""
import bz2
import gzip
import pathlib

import numpy as np
import pytest

import solvers
from solvers.bal import BALFormatError, read_bal, write_bal
from solvers.bal.download import download
from solvers.io.ply import read_ply_vertices, write_ply
from solvers.models.rotation import rotate

from reference_snavely import ReferenceSnavelyModel

# From shared/data/bal/README.md: cameras, points, observations, initial cost.
README = {
    "problem-49-7776-pre": (49, 7776, 31843, 8.509125e+05),
    "problem-73-11032-pre": (73, 11032, 46122, 9.637389e+05),
    "problem-21-11315-pre": (21, 11315, 36455, 4.413239e+06),
    "problem-39-18060-pre": (39, 18060, 63551, 8.408809e+06),
    "problem-16-22106-pre": (16, 22106, 83718, 4.185660e+06),
}


from bal_data import bal_file  # noqa: E402  (skips or fails clearly when the data is absent)


def slow_parse(text):
    """An independent per-line parser (the obvious Python loop), for comparison."""
    lines = text.split("\n")
    nc, npt, no = (int(v) for v in lines[0].split())
    obs = [lines[1 + i].split() for i in range(no)]
    params = np.array([float(lines[1 + no + i]) for i in range(9 * nc + 3 * npt)])
    ci = np.array([int(o[0]) for o in obs])
    pi = np.array([int(o[1]) for o in obs])
    xy = np.array([[float(o[2]), float(o[3])] for o in obs])
    return nc, npt, ci, pi, xy, params[:9 * nc].reshape(nc, 9), params[9 * nc:].reshape(npt, 3)


@pytest.mark.parametrize("name", sorted(README))
def test_real_problems_match_readme(name):
    p = read_bal(bal_file(name))
    nc, npt, no, cost = README[name]
    assert (p.num_cameras, p.num_points, p.num_observations) == (nc, npt, no)
    assert p.name == name
    r = ReferenceSnavelyModel(p.camera_index, p.point_index, p.observations).residuals(p.cameras, p.points)
    assert 0.5 * np.sum(r * r) == pytest.approx(cost, rel=1e-6)


def test_reader_matches_a_per_line_parser():
    text = bz2.open(bal_file("problem-49-7776-pre"), "rt").read()
    nc, npt, ci, pi, xy, cams, pts = slow_parse(text)
    p = read_bal(bal_file("problem-49-7776-pre"))
    np.testing.assert_array_equal(p.camera_index, ci)
    np.testing.assert_array_equal(p.point_index, pi)
    np.testing.assert_array_equal(p.observations, xy)
    np.testing.assert_array_equal(p.cameras, cams)
    np.testing.assert_array_equal(p.points, pts)


def test_small_chunks_give_the_same_problem(tmp_path):
    p = solvers.synthetic_problem(5, 50, 3, seed=1)
    path = tmp_path / "p.txt"
    write_bal(p, path)
    a = read_bal(path)
    b = read_bal(path, chunk_bytes=37)   # chunks much shorter than the file, cut at lines
    for f in ("cameras", "points", "camera_index", "point_index", "observations"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


@pytest.mark.parametrize("suffix", [".txt", ".txt.bz2", ".txt.gz"])
def test_write_read_round_trip_is_exact(tmp_path, suffix):
    p = solvers.synthetic_problem(6, 40, 3, seed=2)
    path = tmp_path / f"p{suffix}"
    write_bal(p, path)
    q = read_bal(path)
    for f in ("cameras", "points", "camera_index", "point_index", "observations"):
        np.testing.assert_array_equal(getattr(q, f), getattr(p, f))
    opener = {".txt": open, ".txt.bz2": bz2.open, ".txt.gz": gzip.open}[suffix]
    with opener(path, "rt") as f:
        assert f.readline().split() == ["6", "40", "120"]


GOOD = "2 3 4\n0 0 1.5 -2\n1 0 3 4\n0 1 5 6\n1 2 7 8\n" + "".join(f"{0.1 * i}\n" for i in range(27))


def write_text(tmp_path, text, name="bad.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_tiny_file(tmp_path):
    p = read_bal(write_text(tmp_path, GOOD))
    assert (p.num_cameras, p.num_points, p.num_observations) == (2, 3, 4)
    np.testing.assert_array_equal(p.observations[0], [1.5, -2.0])
    assert p.points[2, 2] == pytest.approx(2.6)
    # Windows line endings and a trailing blank line are fine.
    q = read_bal(write_text(tmp_path, GOOD.replace("\n", "\r\n") + "\n", "crlf.txt"))
    np.testing.assert_array_equal(q.cameras, p.cameras)


def lines_of(text):
    return text.split("\n")


def replace_line(text, i, new):
    ls = lines_of(text)
    ls[i] = new
    return "\n".join(ls)


@pytest.mark.parametrize("text,line,words", [
    ("", 1, "empty file"),
    ("2 3\n" + GOOD.split("\n", 1)[1], 1, "bad header"),
    ("2 3 x\n" + GOOD.split("\n", 1)[1], 1, "not a number"),
    ("2 3 -4\n" + GOOD.split("\n", 1)[1], 1, "bad header"),
    ("2 3 4.5\n" + GOOD.split("\n", 1)[1], 1, "bad header"),
    (replace_line(GOOD, 2, "1 0 3"), 3, "expected an observation"),
    (replace_line(GOOD, 2, "1 0 3 4 5"), 3, "expected an observation"),
    (replace_line(GOOD, 3, "0 1 abc 6"), 4, "'abc' is not a number"),
    (replace_line(GOOD, 3, "0 1 1.5e 6"), 4, "not a number"),
    (replace_line(GOOD, 1, "2 0 1.5 -2"), 2, "camera index 2 is not an integer in [0, 2)"),
    (replace_line(GOOD, 1, "0 3 1.5 -2"), 2, "point index 3 is not an integer in [0, 3)"),
    (replace_line(GOOD, 1, "0 -1 1.5 -2"), 2, "point index -1"),
    (replace_line(GOOD, 1, "0.5 0 1.5 -2"), 2, "camera index 0.5"),
    (replace_line(GOOD, 4, "1 2 nan 8"), 5, "non-finite observation"),
    (replace_line(GOOD, 7, "inf"), 8, "non-finite value inf for camera 0 parameter 2"),
    (replace_line(GOOD, 30, "-inf"), 31, "non-finite value -inf for point 2 coordinate 1"),
    (replace_line(GOOD, 10, "1 2"), 11, "one parameter value per line"),
    (replace_line(GOOD, 10, ""), 11, "one parameter value per line"),
    ("\n".join(lines_of(GOOD)[:20]) + "\n", 21, "file ends early: found 15 of 27 parameter lines"),
    ("\n".join(lines_of(GOOD)[:3]) + "\n", 4, "file ends early: found 2 of 4 observation lines"),
    (GOOD + "42\n", 33, "unexpected extra data"),
    (GOOD + "\n\n7\n", 35, "unexpected extra data"),
])
def test_malformed_files_raise_with_line_numbers(tmp_path, text, line, words):
    path = write_text(tmp_path, text)
    with pytest.raises(BALFormatError) as e:
        read_bal(path)
    assert e.value.line == line
    assert words in str(e.value)
    assert f"{path}:{line}:" in str(e.value)


def test_malformed_compressed_file(tmp_path):
    path = tmp_path / "cut.txt.bz2"
    path.write_bytes(bz2.compress(GOOD.encode())[:-20])   # truncated stream
    with pytest.raises(BALFormatError, match="cannot read the file"):
        read_bal(path)
    with pytest.raises(FileNotFoundError):
        read_bal(tmp_path / "missing.txt")


def test_bad_token_in_a_later_chunk_reports_its_line(tmp_path):
    text = replace_line(GOOD, 25, "0.1x")
    with pytest.raises(BALFormatError) as e:
        read_bal(write_text(tmp_path, text), chunk_bytes=16)
    assert e.value.line == 26 and "'0.1x' is not a number" in str(e.value)


def test_problem_object_validates():
    p = solvers.synthetic_problem(4, 10, 2, seed=0)
    with pytest.raises(ValueError, match="cameras must be"):
        solvers.BALProblem(p.cameras[:, :8], p.points, p.camera_index, p.point_index, p.observations)
    with pytest.raises(ValueError, match="camera_index has values outside"):
        solvers.BALProblem(p.cameras[:2], p.points, p.camera_index, p.point_index, p.observations)
    with pytest.raises(ValueError, match=r"must be \(num_observations,\)"):
        solvers.BALProblem(p.cameras, p.points, p.camera_index, p.point_index, p.observations[:-1])


def test_synthetic_problem_is_seeded_and_consistent():
    a = solvers.synthetic_problem(8, 100, 3, seed=5)
    b = solvers.synthetic_problem(8, 100, 3, seed=5)
    c = solvers.synthetic_problem(8, 100, 3, seed=6)
    np.testing.assert_array_equal(a.cameras, b.cameras)
    np.testing.assert_array_equal(a.observations, b.observations)
    assert not np.array_equal(a.points, c.points)
    assert a.num_observations == 300 and np.all(np.bincount(a.point_index) == 3)
    # Noise-free and unperturbed: the observations are the exact projections (independent model).
    exact = solvers.synthetic_problem(8, 100, 3, seed=5, noise_px=0, perturb_rotation=0,
                                      perturb_translation=0, perturb_point=0)
    r = ReferenceSnavelyModel(exact.camera_index, exact.point_index, exact.observations).residuals(
        exact.cameras, exact.points)
    assert np.max(np.abs(r)) < 1e-9
    # Every point is in front of every camera observing it (BAL cameras look down -z).
    P = rotate(exact.cameras[exact.camera_index, :3], exact.points[exact.point_index]) + \
        exact.cameras[exact.camera_index, 3:6]
    assert np.all(P[:, 2] < 0)
    with pytest.raises(ValueError, match="obs_per_point"):
        solvers.synthetic_problem(3, 10, 5)


def test_ply_has_points_and_camera_centres(tmp_path):
    p = solvers.synthetic_problem(5, 30, 2, seed=3)
    path = tmp_path / "cloud.ply"
    write_ply(p, path)
    xyz, rgb = read_ply_vertices(path)
    assert xyz.shape == (35, 3)
    centres = xyz[:5]
    # A camera centre c satisfies R(w) c + t = 0.
    residual = rotate(p.cameras[:, :3], centres) + p.cameras[:, 3:6]
    assert np.max(np.abs(residual)) < 1e-5          # %f keeps 6 decimals
    np.testing.assert_allclose(xyz[5:], p.points, atol=1e-6)
    assert np.all(rgb[:5] == [0, 255, 0]) and np.all(rgb[5:] == 255)
    assert path.read_text().startswith("ply\nformat ascii 1.0\nelement vertex 35\n")


def test_download_from_a_file_url_and_cache(tmp_path):
    mirror = tmp_path / "mirror" / "ladybug"
    mirror.mkdir(parents=True)
    src = bal_file("problem-49-7776-pre")
    (mirror / src.name).write_bytes(src.read_bytes())
    cache = tmp_path / "cache"
    url = (tmp_path / "mirror").as_uri()
    path = download("problem-49-7776-pre", cache=str(cache), base_url=url)
    assert path == str(cache / "ladybug" / "problem-49-7776-pre.txt.bz2")
    assert pathlib.Path(path).read_bytes() == src.read_bytes()
    assert read_bal(path).num_observations == 31843
    # Cached: found again without the mirror.
    (mirror / src.name).unlink()
    assert download("ladybug/problem-49-7776-pre.txt.bz2", cache=str(cache), base_url=url) == path
    # Missing on the mirror: a clear error naming the URL, nothing left in the cache.
    with pytest.raises(OSError, match="problem-21-11315-pre.txt.bz2"):
        download("problem-21-11315-pre", cache=str(cache), base_url=url)
    assert not (cache / "trafalgar" / "problem-21-11315-pre.txt.bz2").exists()
    assert not list((cache / "trafalgar").glob("*.partial"))
    # Not a BAL file on the mirror.
    (tmp_path / "mirror" / "final").mkdir()
    (tmp_path / "mirror" / "final" / "problem-93-61203-pre.txt.bz2").write_bytes(b"not bzip2")
    with pytest.raises(ValueError, match="not a bzip2 file"):
        download("problem-93-61203-pre", cache=str(cache), base_url=url)
    with pytest.raises(ValueError, match="group"):
        download("problem-1-2-pre", cache=str(cache), base_url=url)
    with pytest.raises(ValueError, match="not one of"):
        download("problem-1-2-pre", group="nowhere", cache=str(cache), base_url=url)


def test_with_parameters_shares_the_observations_and_checks_the_new_parameters():
    """The result's problem (BundleAdjustResult.problem) comes from with_parameters: the
    observations and indices are the problem's own arrays (not checked again: that took over a
    second at 116M observations), the new cameras and points are checked."""
    p = solvers.synthetic_problem(5, 40, 3, seed=2)
    q = p.with_parameters(p.cameras + 1.0, p.points.astype(np.float32))
    assert q.observations is p.observations and q.camera_index is p.camera_index
    assert q.points.dtype == np.float64 and np.array_equal(q.cameras, p.cameras + 1.0)
    with pytest.raises(ValueError, match=r"must have the problem's shapes"):
        p.with_parameters(p.cameras[:4], p.points)
    bad = p.points.copy()
    bad[7, 2] = np.inf
    with pytest.raises(ValueError, match=r"points\[7\] = .* is not finite"):
        p.with_parameters(p.cameras, bad)
    with pytest.raises(ValueError, match=r"cameras must be \(num_cameras, 9\)"):
        p.with_parameters(p.cameras[:, :8], p.points)
