"""muster.demo: `muster demo` and the doubles tests and benchmarks run the daemon against.

- `harness`: the demo itself (embedded NATS, the emulated cluster, the real daemon), `cli` its command;
- `workload`, `view`, `dcgm`: the teams' gangs, the live view, a fake dcgm-exporter;
- `emulator`: `KubeEmulator`, a Kubernetes API server double (kmock), and `running()`;
- `kubelet_sim`: `SimulatedKubelet`, which runs bound pods in a cluster without kubelets;
- `simcluster`: `SimulatedCluster`, an in-process cluster behind the daemon's `Cluster` interface.

The production daemon imports none of it (an import-linter contract says so), but for
`muster daemon --simulated-cluster`, which runs it on `simcluster`.
"""
