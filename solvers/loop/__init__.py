"""The Levenberg-Marquardt loop, apart from what it solves: the minimizer and its options
(:mod:`.lm`), the protocol every loop state implements and the step a state returns
(:mod:`.step`), the per-iteration records and reports (:mod:`.summary`), checkpoints
(:mod:`.checkpoint`). Nothing here knows bundle adjustment, a device or a split.
"""
