"""muster.daemon.k8s: the Kubernetes adapter (watch nodes and pods, recognise gangs, bind and evict).

- `KubernetesAdapter(api_client, *, scheduler_name="muster")`: `await tg.start(adapter.run, sink)`,
  then `await adapter.apply(decision) -> ApplyResult`.
- `SimulatedKubelet(api_client, *, speed=1.0)`: runs bound pods in a cluster without kubelets.
- `muster.daemon.k8s.emulator` (imports kmock, so it is not imported here): `KubeEmulator`, a
  Kubernetes API server double, and `running()` to serve it with an ApiClient.
"""

from muster.daemon.k8s.adapter import KubernetesAdapter, Sink
from muster.daemon.k8s.applying import Applier, ApplyResult
from muster.daemon.k8s.errors import Conflict, KubeError, NotFound, PermanentError, ResourceGone, TemporaryError
from muster.daemon.k8s.kubelet_sim import SimulatedKubelet
from muster.daemon.k8s.watching import Backoff

__all__ = [
    "Applier",
    "ApplyResult",
    "Backoff",
    "Conflict",
    "KubeError",
    "KubernetesAdapter",
    "NotFound",
    "PermanentError",
    "ResourceGone",
    "SimulatedKubelet",
    "Sink",
    "TemporaryError",
]
