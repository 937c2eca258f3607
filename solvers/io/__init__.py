"""Files: writers that leave the old whole or the new whole (:mod:`.atomic`), the command
lines' promises about their outputs (:mod:`.cli_output`), PLY point clouds (:mod:`.ply`) and
progress bars for long reads (:mod:`.progress`). BAL and COLMAP formats live in
:mod:`solvers.bal` and :mod:`solvers.colmap`.
"""
