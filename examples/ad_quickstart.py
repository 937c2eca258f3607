"""Values and Jacobians of a small function for a million tuples, checked against finite
differences on a few of them.

    python examples/ad_quickstart.py [--tuples N]
"""
import argparse
import time

import numpy as np

import clkernels
import pyclad as pc


def range_bearing(pose, landmark):
    """2-D robot pose (x, y, heading) observing a landmark (x, y): range and bearing."""
    dx, dy = landmark[0] - pose[0], landmark[1] - pose[1]
    return [pc.sqrt(dx * dx + dy * dy), pc.atan2(dy, dx) - pose[2]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuples", type=int, default=1_000_000, help="how many tuples to evaluate (default 1,000,000)")
    n = ap.parse_args().tuples
    rng = np.random.default_rng(0)
    poses = rng.normal(0, 5, (1000, 3))
    landmarks = rng.normal(0, 20, (5000, 2))
    index = np.stack([rng.integers(0, 1000, n), rng.integers(0, 5000, n)], axis=1)

    f = pc.BatchFunction(range_bearing, params=(3, 2))
    print(f)
    f.values_and_jacobians([poses, landmarks], index[:10])  # compile once
    t0 = time.perf_counter()
    r, (j_pose, j_landmark) = f.values_and_jacobians([poses, landmarks], index)
    print(f"{n} tuples in {time.perf_counter() - t0:.3f} s on {clkernels.get_runtime().info.name}: "
          f"r {r.shape}, J_pose {j_pose.shape}, J_landmark {j_landmark.shape}")

    # Central differences on the first tuple, as a sanity check anyone can read.
    k, h = 0, 1e-6
    p, l = poses[index[k, 0]].copy(), landmarks[index[k, 1]]
    for j in range(3):
        plus, minus = p.copy(), p.copy()
        plus[j] += h
        minus[j] -= h
        fd = (np.array(f.values([plus[None], l[None]], [[0, 0]])[0]) -
              np.array(f.values([minus[None], l[None]], [[0, 0]])[0])) / (2 * h)
        print(f"d r / d pose[{j}]: pyclad {j_pose[k, :, j]}, central difference {fd}")


if __name__ == "__main__":
    main()
