"""The web dashboard (`muster ui`): a read-only view of the log, now or at any past point."""
