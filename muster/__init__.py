"""muster: an event-sourced gang scheduler for GPU batch work on Kubernetes."""

__version__ = "0.1.0"
