## The pairs of sparse_schur's reduced pattern made on the device (solvers/linalg/schur_pattern_device.py):
## the two kernels between clkernels.sort's passes. Groups are camera-point groups numbered in camera
## order; by_pt lists them in point order (cameras ascending within a point) and where[g] is g's
## place in it; point_start[p] where point p's groups begin there. A group pairs with itself and
## with the groups after it in its point's run. No render parameters: every size is an argument.

// partners[g] = the number of pairs of group g: itself and the groups after it in its point's run.
__kernel void group_partners(__global const int *group_pt, __global const int *where,
                             __global const int *point_start, const int ng, __global int *partners)
{
    const int g = get_global_id(0);
    if (g < ng)
        partners[g] = point_start[group_pt[g] + 1] - where[g];
}

// Group g's pairs from pair_first[g] on, in the order of its point's run: (g, by_pt[where[g] + k])
// and their block's key cam(a) * nc + cam(b) (nc * nc < 2^31, checked by the caller).
__kernel void expand_pairs(__global const int *partners, __global const int *pair_first,
                           __global const int *where, __global const int *by_pt,
                           __global const int *group_cam, const int ng, const int nc,
                           __global int *pair_a, __global int *pair_b, __global int *key)
{
    const int g = get_global_id(0);
    if (g >= ng)
        return;
    const int first = pair_first[g], count = partners[g], at = where[g];
    const int row = group_cam[g] * nc;
    for (int k = 0; k < count; ++k) {
        const int b = by_pt[at + k];
        pair_a[first + k] = g;
        pair_b[first + k] = b;
        key[first + k] = row + group_cam[b];
    }
}
