"""The bundle-adjustment core: two parameter groups (cameras and points), every residual
seeing one of each. Its evaluator (:mod:`.evaluator`), the observations' orderings
(:mod:`.ordering`, :mod:`.observations_device`), the normal equations on the host
(:mod:`.schur`, with the device's products in :mod:`.schur_device`), and the two loop states:
:class:`.host_state.HostState` (the reference) and :class:`.lm_device.DeviceState` (every
iteration on the device).
"""
