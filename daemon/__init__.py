"""muster.daemon: the imperative shell (process, leader election, Kubernetes adapter)."""
