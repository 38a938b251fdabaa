"""muster.projections: pure folds of the event log and the scheduling policy.

Nothing here performs I/O, reads a clock or draws unseeded random numbers.
"""
