"""muster.replay: audit tooling over the log, and the virtual-time simulator."""
