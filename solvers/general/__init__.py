"""The general core: any :class:`.problem.Problem` (named groups, several residual kinds,
constant rows and entries). Its evaluator (:mod:`.problem_evaluator`), groups merged where one
kind always uses them together (:mod:`.merged_groups`), the loop state
(:class:`.sparse_state.SparseState`) and the Schur reductions by pairs of observations, on the
host (:mod:`.pair_schur`) and on the device (:mod:`.pair_schur_device`,
:mod:`.implicit_schur_device`, :mod:`.key_copies_device`).
"""
