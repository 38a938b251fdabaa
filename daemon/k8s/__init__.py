"""muster.daemon.k8s: the Kubernetes adapter (watch nodes and pods, recognise gangs, bind and evict).

- `KubernetesAdapter(api_client, *, scheduler_name="muster")`: `await tg.start(adapter.run, sink)`,
  then `await adapter.apply(decision) -> ApplyResult`.
- The demo's Kubernetes API double and simulated kubelet live in `muster.demo` (`demo/`): the
  production daemon imports none of it.
"""

from muster.daemon.k8s.adapter import KubernetesAdapter, Sink
from muster.daemon.k8s.applying import Applier, ApplyResult
from muster.daemon.k8s.errors import Conflict, KubeError, NotFound, PermanentError, ResourceGone, TemporaryError
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
    "Sink",
    "TemporaryError",
]
