"""What a residual computes: robust losses (:mod:`.loss`), COLMAP's camera models as
pyclad-traceable residuals (:mod:`.cameras`), BAL's Snavely camera (:mod:`.snavely`) on the
two-group model of any ``BatchFunction`` (:mod:`.batch_model`), and angle-axis rotation in numpy
(:mod:`.rotation`).
"""
