## Device-side ordering primitives (clkernels/sort.py): an LSD radix sort of (key, index) pairs,
## a device-wide exclusive scan, key counts, an inverse permutation and a row gather.
##
## Render parameters (only what changes code; every size, shift and mask is a kernel argument):
##   L      work-group size of the radix and scan kernels (a power of two)
##   K      elements per work-item in the radix kernels: a tile is L*K contiguous elements
##   BITS   bits per radix digit (4 on GPUs, whose local memory holds 16 x L counters; 8 on CPUs)
##   SK     elements per work-item in the scan kernels: a block is L*SK elements
##   item   0: the program of everything but take; 4 or 8: the program of take alone, for
##          elements of that many bytes (copied as bits: float64 rows need no cl_khr_fp64)
##   W      elements per row of take (1 when item is 0)
##   vector take copies a row as one vector (W is 2, 3, 4, 8 or 16, within a CPU's native width)
##
## Sizes are ulong and positions size_t: n reaches 2^31 - 1 and tile * TILE + lid * K, or
## digit * ntiles + tile, can pass an int. Counts and ranks stay int (they are at most n).

%if not item:
#define RADIX (1 << ${BITS})
#define TILE (${L} * ${K})
#define BLOCK (${L} * ${SK})
// One padding word per 32 local entries: the counters of one digit (consecutive items) and the
// raking runs (consecutive entries per item) then fall in distinct banks on GPUs.
#define PAD(x) ((x) + ((x) >> 5))

<%def name="group_scan(R)">
// Exclusive scan, in place, of the R*L entries s[PAD(0 .. R*L)), in order of their index;
// returns the total to every work-item. Raking: item t sums its R consecutive entries, the L
// partial sums are scanned (Hillis-Steele, log2 L steps) and each item rewrites its entries.
// The caller has written s and passed a barrier; s is scanned and visible on return.
int group_scan_${R}(__local int *s, __local int *part, const int lid)
{
    int sum = 0;
    for (int r = 0; r < ${R}; ++r)
        sum += s[PAD(lid * ${R} + r)];
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int off = 1; off < ${L}; off <<= 1) {
        const int add = lid >= off ? part[lid - off] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        part[lid] += add;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int total = part[${L} - 1];
    int run = part[lid] - sum;
    for (int r = 0; r < ${R}; ++r) {
        const int v = s[PAD(lid * ${R} + r)];
        s[PAD(lid * ${R} + r)] = run;
        run += v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}
</%def>

${group_scan(1 << BITS)}
%if SK != (1 << BITS):
${group_scan(SK)}
%endif

// ------------------------------------------------------------------------------ radix sort

// The digit of a key in this pass. The mask (ndigits - 1) is applied to every key, in range or
// not, and the count and scatter kernels compute it alike: the scatter's destinations are then
// a permutation of 0 .. n-1 whatever the keys hold, so a bad key cannot write out of bounds.
#define DIGIT(key) (int)(((uint)(key) >> shift) & mask)

// Counts this item's run of K elements per digit into its column of the tile's table
// s[PAD(d * L + lid)] (digit-major: an item owns its column, no atomics), then scans the table:
// afterwards s[PAD(d * L + lid)] is the number of the tile's elements that precede this item's
// first element of digit d in a stable order (all smaller digits, then digit d in earlier items).
int tile_ranks(__global const int *keys, const ulong n, const int shift, const uint mask,
               __local int *s, __local int *part, const int lid, const size_t first)
{
    for (int d = 0; d < RADIX; ++d)
        s[PAD(d * ${L} + lid)] = 0;
    for (int k = 0; k < ${K}; ++k) {
        const size_t j = first + k;
        if (j < n)
            s[PAD(DIGIT(keys[j]) * ${L} + lid)] += 1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return group_scan_${1 << BITS}(s, part, lid);
}

// tile_hist[d * ntiles + tile] = the number of elements of digit d in the tile, for d <= mask:
// digit-major, so that its exclusive scan gives each (digit, tile) its first output position.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void radix_count(__global const int *keys, const ulong n, const int shift, const uint mask,
                 const ulong ntiles, __global int *tile_hist)
{
    __local int s[PAD(RADIX * ${L})];
    __local int part[${L}];
    const int lid = get_local_id(0);
    const size_t tile = get_group_id(0);
    const int total = tile_ranks(keys, n, shift, mask, s, part, lid, tile * TILE + (size_t)lid * ${K});
    for (uint d = lid; d <= mask; d += ${L})
        tile_hist[d * ntiles + tile] = (d < mask ? s[PAD((d + 1) * ${L})] : total) - s[PAD(d * ${L})];
}

// Writes each element of the tile where it goes: tile_start (the scanned tile_hist) gives the
// first position of the tile's digit d, the table its rank among them. Each item walks its own
// run in order, so equal digits keep their input order (stable). first_pass: the values are
// the positions themselves (no values to read); write_keys 0 in the last pass (nobody reads them).
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void radix_scatter(__global const int *keys_in, __global const int *vals_in, const ulong n,
                   const int shift, const uint mask, const ulong ntiles,
                   __global const int *tile_start, __global int *keys_out,
                   __global int *vals_out, const int first_pass, const int write_keys)
{
    __local int s[PAD(RADIX * ${L})];
    __local int part[${L}];
    __local int base[RADIX];
    const int lid = get_local_id(0);
    const size_t tile = get_group_id(0);
    const size_t first = tile * TILE + (size_t)lid * ${K};
    tile_ranks(keys_in, n, shift, mask, s, part, lid, first);
    // Read every column's head before item 0 starts counting up its own (the walk below).
    for (uint d = lid; d <= mask; d += ${L})
        base[d] = tile_start[d * ntiles + tile] - s[PAD(d * ${L})];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < ${K}; ++k) {
        const size_t j = first + k;
        if (j >= n)
            break;
        const int key = keys_in[j];
        const int d = DIGIT(key);
        const int dest = base[d] + s[PAD(d * ${L} + lid)]++;
        // Always true (see DIGIT); kept so that no future change can turn into a wild write.
        if ((uint)dest < n) {
            vals_out[dest] = first_pass ? (int)j : vals_in[j];
            if (write_keys)
                keys_out[dest] = key;
        }
    }
}

// flag[0] |= 1 if a key lies outside [0, bound): the check=True path of sort.py.
__kernel void check_keys(__global const int *keys, const ulong n, const uint bound,
                         volatile __global int *flag)
{
    const size_t i = get_global_id(0);
    if (i < n && (uint)keys[i] >= bound)
        atomic_or(flag, 1);
}

// --------------------------------------------------------------------------------- scans

// sums[b] = the sum of block b (BLOCK elements of a, n of them), read coalesced.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void block_sums(__global const int *a, const ulong n, __global int *sums)
{
    __local int part[${L}];
    const int lid = get_local_id(0);
    const size_t first = get_group_id(0) * (size_t)BLOCK;
    int sum = 0;
    for (int k = 0; k < ${SK}; ++k) {
        const size_t j = first + lid + k * ${L};
        if (j < n)
            sum += a[j];
    }
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = ${L} / 2; width > 0; width >>= 1) {
        if (lid < width)
            part[lid] += part[lid + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        sums[get_group_id(0)] = part[0];
}

// out[0 .. n_out) = the exclusive scan of a[0 .. n_in) read as zeros past n_in (n_out = n_in + 1
// puts the total at the end), block b plus offsets[b] when with_offsets (the scanned block sums).
// out may be a: every element is read and written by the same work-item.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void scan_blocks(__global const int *a, const ulong n_in, const ulong n_out,
                 __global const int *offsets, const int with_offsets, __global int *out)
{
    __local int s[PAD(BLOCK)];
    __local int part[${L}];
    const int lid = get_local_id(0);
    const size_t first = get_group_id(0) * (size_t)BLOCK;
    for (int k = 0; k < ${SK}; ++k) {
        const int j = lid + k * ${L};
        s[PAD(j)] = first + j < n_in ? a[first + j] : 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    group_scan_${SK}(s, part, lid);
    const int offset = with_offsets ? offsets[get_group_id(0)] : 0;
    for (int k = 0; k < ${SK}; ++k) {
        const int j = lid + k * ${L};
        if (first + j < n_out)
            out[first + j] = s[PAD(j)] + offset;
    }
}

// ------------------------------------------------------------------- counts, permutations

// a[i] = value + step * i for i < n: zeros (step 0) or 0, 1, 2, ... (step 1).
__kernel void fill_int(__global int *a, const ulong n, const int value, const int step)
{
    const size_t i = get_global_id(0);
    if (i < n)
        a[i] = value + step * (int)i;
}

// counts[key] += 1 for every key, a run of K keys per work-item: equal neighbours (keys that
// come sorted, or one key class that dominates) cost one atomic per run, not one per key. A key
// outside [0, bound) is counted nowhere and sets flag[0].
__kernel void count_keys(__global const int *keys, const ulong n, const uint bound,
                         volatile __global int *counts, volatile __global int *flag)
{
    const size_t first = get_global_id(0) * (size_t)${K};
    int key = 0, run = 0;
    for (int k = 0; k < ${K}; ++k) {
        const size_t j = first + k;
        if (j >= n)
            break;
        const int next = keys[j];
        if (run && next != key) {
            if ((uint)key < bound) atomic_add(&counts[key], run); else atomic_or(flag, 1);
            run = 0;
        }
        key = next;
        ++run;
    }
    if (run) {
        if ((uint)key < bound) atomic_add(&counts[key], run); else atomic_or(flag, 1);
    }
}

// out[i] = (a[i], b[i]): two int32 columns side by side, rows of two.
__kernel void stack_pairs(__global const int *a, __global const int *b, const ulong n,
                          __global int *out)
{
    const size_t i = get_global_id(0);
    if (i < n) {
        out[2 * i] = a[i];
        out[2 * i + 1] = b[i];
    }
}

// flags[i] = 1 where a run of equal (a[i], b[i]) begins (i = 0, or either differs from row
// i - 1), else 0; b may be a (runs of a alone).
__kernel void run_flags(__global const int *a, __global const int *b, const ulong n,
                        __global int *flags)
{
    const size_t i = get_global_id(0);
    if (i < n)
        flags[i] = i == 0 || a[i] != a[i - 1] || b[i] != b[i - 1];
}

// out[at[i]] = i where flags[i] (at: the exclusive scan of flags): the flagged positions, in
// order (np.flatnonzero).
__kernel void flagged_positions(__global const int *flags, __global const int *at, const ulong n,
                                __global int *out)
{
    const size_t i = get_global_id(0);
    if (i < n && flags[i])
        out[at[i]] = (int)i;
}

// q[p[i]] = i; an entry of p outside [0, n) writes nothing and sets flag[0].
__kernel void inverse_permutation(__global const int *p, const ulong n, __global int *q,
                                  volatile __global int *flag)
{
    const size_t i = get_global_id(0);
    if (i >= n)
        return;
    const uint v = (uint)p[i];
    if (v < n)
        q[v] = (int)i;
    else
        atomic_or(flag, 1);
}

%else:
<% T = {4: "uint", 8: "ulong"}[item] %>
// out[i, :] = a[idx[i], :], rows of ${W} elements of ${item} bytes. An index outside
// [0, rows) reads the nearest row (numpy's mode="clip") and sets flag[0]; rows >= 1.
__kernel void take_rows(__global const ${T} *a, const ulong rows, __global const int *idx,
                        const ulong n, __global ${T} *out, volatile __global int *flag)
{
    const size_t i = get_global_id(0);
    if (i >= n)
        return;
    const int r = idx[i];
    size_t row = (size_t)r;
    if ((uint)r >= rows) {
        atomic_or(flag, 1);
        row = r < 0 ? 0 : rows - 1;
    }
%if W == 1:
    out[i] = a[row];
%elif vector:
    vstore${W}(vload${W}(row, a), i, out);
%else:
    for (int j = 0; j < ${W}; ++j)
        out[i * ${W} + j] = a[row * ${W} + j];
%endif
}
%endif
