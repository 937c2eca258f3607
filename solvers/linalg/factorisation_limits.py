"""Where a reduced camera matrix (or the general core's reduced matrix) is factorised, by size:
the thresholds in one place. Every path reads them here when it decides, so a test or a
benchmark that sets one here changes every path that uses it.

- Host, dense LAPACK Cholesky (one thread, solvers.linalg.blas_threads) up to :data:`HOST_DENSE_MAX`
  unknowns (111 cameras of 9: a few ms); a sparse factorisation above.
- A nearly full matrix (cameras that all see the same points, as a COLMAP scene's) factorises
  faster dense at any size up to :data:`DENSE_FILL_MAX` where its entries fill at least
  :data:`DENSE_FILL` of it (a sparse factorisation of it measured 5-15x slower).
- On the device (solvers.linalg.sparse_schur_device), dense Cholesky up to :data:`DEVICE_DENSE_MAX`
  unknowns on GPUs and accelerators (16384: a 2 GiB matrix, about 1.5 TFLOP, a fraction of a
  second on a data-centre GPU), taking at most :data:`DENSE_MEMORY_FRACTION` of the memory the
  rest of the solve leaves; on CPU devices never (:data:`DEVICE_DENSE_MAX_CPU`: PoCL's measured
  3-8x slower than LAPACK on the same cores).
"""
HOST_DENSE_MAX = 1000
DENSE_FILL = 0.3
DENSE_FILL_MAX = 16384
DEVICE_DENSE_MAX = 16384
DEVICE_DENSE_MAX_CPU = 0
DENSE_MEMORY_FRACTION = 0.5


def host_dense(n_unknowns: int, fill: float = 0.0, forced: bool = False) -> bool:
    """Whether the host factorises a reduced matrix of ``n_unknowns`` dense (LAPACK's Cholesky)
    rather than sparse: small, or nearly full (``fill``: the fraction of its blocks that are
    nonzero), or ``forced`` by the linear solver (``dense_schur``'s kind, whatever the size).
    A forced dense matrix that the host's memory cannot hold is refused here, before it is made,
    with :class:`clkernels.DeviceMemoryError`."""
    if n_unknowns <= HOST_DENSE_MAX or (fill >= DENSE_FILL and n_unknowns <= DENSE_FILL_MAX):
        return True
    if forced:
        _check_host_fits(n_unknowns)
    return forced


def _check_host_fits(n_unknowns: int):
    from clkernels.memory import DeviceMemoryError, host_available
    need = 2 * 8 * n_unknowns ** 2         # the matrix and its factor, float64
    have, why = host_available()
    if have is not None and need > have:
        raise DeviceMemoryError(
            f"the linear solver factorises the {n_unknowns} x {n_unknowns} reduced matrix dense (dense_schur): "
            f"{need / 2**30:.2f} GiB on the host, but only {have / 2**30:.2f} GiB is available ({why}); "
            "use linear_solver='sparse_schur' (dense where that pays) or 'iterative_schur'", need, have)
