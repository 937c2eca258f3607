"""Bundle adjustment split over several devices of one host or over MPI ranks: the
parts (:mod:`.parts`), the split loop states on the host (:mod:`.partitioned`) and on the
devices (:mod:`.partitioned_device`), the ranks' agreement on the problem
(:mod:`.rank_consistency`) and the command lines' ``--devices`` / ``--mpi`` (:mod:`.cli`).
"""
