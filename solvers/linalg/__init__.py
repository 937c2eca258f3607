"""The linear algebra of a step, shared by the cores: the linear-solver registry
(:mod:`.linear_solver`), where a matrix is factorised by size (:mod:`.factorisation_limits`),
host factorisations and CG (:mod:`.host_cholesky`, :mod:`.cg`, :mod:`.blas_threads`), and the
device's: the Schur PCG, the reduced camera system, its dense Cholesky, segmented block products
and read-only inputs. A module that runs OpenCL kernels ends in ``_device``; its template is
``<module>.cl.mako`` beside it.
"""
