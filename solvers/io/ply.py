"""PLY point clouds of a reconstruction, as Ceres' ``BALProblem::WriteToPLYFile`` writes them:
ASCII, camera centres in green, points in white."""
from __future__ import annotations

import numpy as np


def write_ply(problem, path) -> None:
    """Write the points (white) and camera centres (green) of ``problem`` to an ASCII PLY file,
    checked first (finite coordinates) and renamed into place once whole (:mod:`solvers.io.atomic`)."""
    from .atomic import replacing
    centers = np.asarray(problem.camera_centers(), np.float64)
    points = np.asarray(problem.points, np.float64)
    for what, a in (("camera centre", centers), ("point", points)):
        bad = np.flatnonzero(~np.isfinite(a).all(axis=1)) if a.size else []
        if len(bad):
            raise ValueError(f"write_ply: {what} {int(bad[0])} is not finite ({a[bad[0]].tolist()}); "
                             "a PLY file cannot hold it")
    n = centers.shape[0] + points.shape[0]
    with replacing(path, "w") as f:
        f.write("ply\nformat ascii 1.0\n"
                f"element vertex {n}\n"
                "property float x\nproperty float y\nproperty float z\n"
                "property uchar red\nproperty uchar green\nproperty uchar blue\n"
                "end_header\n")
        np.savetxt(f, centers, fmt="%f %f %f 0 255 0")
        np.savetxt(f, points, fmt="%f %f %f 255 255 255")


def read_ply_vertices(path):
    """``(xyz (n, 3), rgb (n, 3))`` of an ASCII PLY file written by :func:`write_ply`."""
    with open(path) as f:
        header = []
        for line in f:
            header.append(line.strip())
            if line.strip() == "end_header":
                break
        if not header or header[0] != "ply" or header[-1] != "end_header":
            raise ValueError(f"{path}: not an ASCII PLY file")
        data = np.loadtxt(f, ndmin=2)
    n = next(int(h.split()[2]) for h in header if h.startswith("element vertex"))
    if data.shape != (n, 6):
        raise ValueError(f"{path}: expected {n} vertices of 6 values, found {data.shape}")
    return data[:, :3], data[:, 3:].astype(np.uint8)
