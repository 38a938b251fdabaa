"""Acting as the controllers and kubelets a bare API server lacks, for the real-server tests.

`Kube(api, namespace)` creates what a cluster's other components would: Ready nodes
(created, then status patched Ready and the `not-ready` taint removed, as the node
lifecycle controller does once the kubelet reports), pods as a Job controller or a user
creates them (with ownerReferences carrying the server's uids), deletions as a kubelet
confirms them (grace period 0). Nodes are named `<namespace>-<name>` and labelled with
the namespace, so `cleanup()` finds what one test made on a server shared by the session.

`eventually(check)` polls an async or plain predicate until it holds or a deadline passes
(no fixed sleeps in the tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import adapterkit
import anyio
from adapterkit import EventLog, eventually
from kubernetes_asyncio.client import (
    ApiClient,
    ApiextensionsV1Api,
    BatchV1Api,
    CoreV1Api,
    CustomObjectsApi,
    RbacAuthorizationV1Api,
)
from kubernetes_asyncio.client.exceptions import ApiException

from muster.daemon.cluster import KubeCluster
from muster.daemon.k8s import Backoff, KubernetesAdapter
from muster.daemon.k8s import manifests as m
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.store import EventStore, StoredEvent
from muster.events.types import JobAdmitted, JobFinished, JobStarted, JobSubmitted, NodeName, QueueName

Obj = dict[str, Any]
TEST_LABEL = "muster.dev/test"
MERGE = "application/merge-patch+json"


FAST = Backoff(initial=0.01, maximum=0.2, jitter=0.0)


@contextlib.asynccontextmanager
async def running_adapter(api: ApiClient, **options: Any) -> AsyncIterator[tuple[KubernetesAdapter, EventLog]]:
    """A KubernetesAdapter running against `api` until the block ends; its sink is the EventLog."""
    options.setdefault("backoff", FAST)
    async with adapterkit.running_adapter(api, **options) as running:
        yield running


@contextlib.asynccontextmanager
async def running_daemon(store: EventStore, api: ApiClient, **adapter_options: Any) -> AsyncIterator[SchedulerLoop]:
    """The scheduler loop leading alone, its cluster the Kubernetes adapter on `api`, until the block ends."""
    adapter_options.setdefault("backoff", FAST)
    loop = SchedulerLoop(
        store, elector=SoleElector("daemon"), cluster=KubeCluster.factory(api, **adapter_options), options=LoopOptions()
    )
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):
            await loop.first_term.wait()
        yield loop
        loop.stop()


async def submitted(events: EventLog) -> JobSubmitted:
    """The one gang a running adapter submits (waited for)."""
    await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
    [sub] = events.of(JobSubmitted)
    return sub


def admitted(sub: JobSubmitted, node: str, at: int = 1) -> JobAdmitted:
    """The admission of the whole gang `sub` onto `node` (queue q)."""
    return JobAdmitted(at=at, job=sub.job, queue=QueueName("q"), placement={p: NodeName(node) for p in sub.pods})


async def started(adapter: KubernetesAdapter, events: EventLog, kube: Kube, sub: JobSubmitted, node: str) -> None:
    """Apply the admission of `sub` on `node` and start its pods as their kubelet would: its JobStarted is reported."""
    assert (await adapter.apply(admitted(sub, node))).outcome == "applied"
    for key in sorted(sub.pods.values()):
        await kube.set_phase(key.split("/")[1], "Running")
    await events.wait_for(lambda e: bool(e.of(JobStarted)))


async def replacement_finishes(
    adapter: KubernetesAdapter, events: EventLog, kube: Kube, admission: JobAdmitted, replacement: str
) -> None:
    """A re-admission binds the one pod `replacement`, which runs and succeeds: the job is reported finished."""
    again = await adapter.apply(admission)
    assert (again.outcome, sorted(again.pods)) == ("applied", [f"{kube.ns}/{replacement}"]), again
    starts = len(events.of(JobStarted))
    await kube.set_phase(replacement, "Running")
    await events.wait_for(lambda e: len(e.of(JobStarted)) > starts)
    await kube.set_phase(replacement, "Succeeded")
    await events.wait_for(lambda e: bool(e.of(JobFinished)))


async def log_of(store: EventStore, cls: type[Any]) -> list[Any]:
    """The events of type `cls` on the log."""
    stored: list[StoredEvent] = await store.read()
    return [s.event for s in stored if isinstance(s.event, cls)]


def crd(group: str, version: str, kind: str, plural: str) -> Obj:
    """A namespaced CRD that keeps any fields (the controllers' own schemas are not the point here)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


JOBSET_CRD = crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")


class Kube:
    def __init__(self, api: ApiClient, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.core = CoreV1Api(api)
        self.batch = BatchV1Api(api)
        self.rbac = RbacAuthorizationV1Api(api)
        self.cluster_objects: list[tuple[str, str]] = []
        """(kind, name) of cluster-scoped RBAC objects to delete after the test."""

    # ------------------------------------------------------------ namespace

    async def create_namespace(self) -> None:
        await self.core.create_namespace({"metadata": {"name": self.ns, "labels": {TEST_LABEL: self.ns}}})
        # the ServiceAccount admission refuses pods in a namespace without one, and no controller makes it
        await self.core.create_namespaced_service_account(self.ns, {"metadata": {"name": "default"}})

    async def cleanup(self) -> None:
        """Delete what the test made: its pods (at once), its nodes, its jobs, its cluster-wide RBAC, its namespace."""
        await _quiet(self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0))
        await _quiet(self.batch.delete_collection_namespaced_job(self.ns))
        await _quiet(self.core.delete_collection_node(label_selector=f"{TEST_LABEL}={self.ns}"))
        for kind, name in self.cluster_objects:
            if kind == "ClusterRole":
                await _quiet(self.rbac.delete_cluster_role(name))
            else:
                await _quiet(self.rbac.delete_cluster_role_binding(name))
        await _quiet(self.core.delete_namespace(self.ns))

    # ------------------------------------------------------------ nodes

    def node_name(self, name: str) -> str:
        return f"{self.ns}-{name}"

    async def node(self, name: str, *, gpus: int = 8, labels: dict[str, str] | None = None) -> str:
        """A Ready node as a kubelet registers it and the node lifecycle controller clears it; returns its name."""
        full = self.node_name(name)
        obj = m.node(full, gpus=gpus, labels={TEST_LABEL: self.ns, **(labels or {})})
        status = obj.pop("status")
        await self.core.create_node(obj)
        await self.core.patch_node_status(full, {"status": status}, _content_type=MERGE)
        await self.core.patch_node(full, {"spec": {"taints": None}}, _content_type=MERGE)
        return full

    async def delete_node(self, name: str) -> None:
        await self.core.delete_node(name)

    # ------------------------------------------------------------ pods

    async def pod(self, name: str, **args: Any) -> Obj:
        """Create a pod as a user would (`manifests.pod` arguments); returns the server's object."""
        args.setdefault("grace_seconds", 0)
        return await self.create_pod(m.pod(name, self.ns, **args))

    async def create_pod(self, obj: Obj) -> Obj:
        created = await self.core.create_namespaced_pod(self.ns, obj)
        return dict(self.api.sanitize_for_serialization(created))

    async def gang(self, name: str, size: int, *, gpus: int = 1, queue: str = "q", **args: Any) -> list[Obj]:
        """A labelled pod group of `size` pods (`muster.dev/gang`, `muster.dev/gang-size`)."""
        labels = {"muster.dev/gang": name, "muster.dev/gang-size": str(size), "muster.dev/queue": queue}
        return [await self.pod(f"{name}-{i}", gpus=gpus, labels=labels, **args) for i in range(size)]

    async def job(
        self,
        name: str,
        parallelism: int,
        *,
        gpus: int = 1,
        queue: str = "q",
        labels: dict[str, str] | None = None,
        job_labels: dict[str, str] | None = None,
        completions: int | None = None,
        grace_seconds: int = 0,
    ) -> tuple[Obj, list[Obj]]:
        """A batch Job (Indexed; `completions` default `parallelism`) and the pods its controller would
        create first (ownerReferences to the Job's real uid; more with `job_pods`).

        The pods carry `muster.dev/queue: queue` (none when empty) and `labels`; the Job `job_labels`.
        With `grace_seconds` above 0 a deletion of a bound pod leaves it terminating until the test deletes
        it with grace 0, as its kubelet would once its containers stopped.
        """
        manifest = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.ns, "labels": dict(job_labels or {})},
            "spec": {
                "parallelism": parallelism,
                "completions": completions or parallelism,
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "schedulerName": "muster",
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            },
        }
        job = dict(self.api.sanitize_for_serialization(await self.batch.create_namespaced_job(self.ns, manifest)))
        pod_labels = {**({"muster.dev/queue": queue} if queue else {}), **(labels or {})}
        return job, await self.job_pods(job, gpus=gpus, labels=pod_labels, grace_seconds=grace_seconds)

    async def set_job_status(self, job: Obj, status: Obj) -> None:
        """Write the Job's status, as its controller does (`succeeded`, ...)."""
        name = job["metadata"]["name"]
        await self.batch.patch_namespaced_job_status(name, self.ns, {"status": status}, _content_type=MERGE)

    async def job_pods(self, job: Obj, indexes: list[int] | None = None, **pod_args: Any) -> list[Obj]:
        """Create pods as `job`'s controller does (`manifests.job_pods` arguments); the server's objects."""
        pod_args.setdefault("grace_seconds", 0)
        return [await self.create_pod(p) for p in m.job_pods(job, indexes, **pod_args)]

    async def jobset(self, name: str, replicas: int, parallelism: int, *, gpus: int = 1) -> tuple[Obj, list[Obj]]:
        """A JobSet (its CRD installed if need be) and the pods its controller's child Jobs would create."""
        try:
            await ApiextensionsV1Api(self.api).create_custom_resource_definition(JOBSET_CRD)
        except ApiException as exc:
            if exc.status != 409:
                raise
        custom = CustomObjectsApi(self.api)
        manifest = m.jobset(name, self.ns, replicated=[("workers", replicas, parallelism)])
        del manifest["metadata"]["uid"]

        async def create() -> Obj | None:
            try:
                return dict(
                    await custom.create_namespaced_custom_object(
                        "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets", manifest
                    )
                )
            except ApiException as exc:
                if exc.status == 404:  # the CRD is not served yet
                    return None
                raise

        obj: Obj = await eventually(create)
        labels = {"muster.dev/queue": "q"}
        pods = [await self.create_pod(p) for p in m.jobset_pods(obj, gpus=gpus, grace_seconds=0, labels=labels)]
        return obj, pods

    async def custom(self, manifest: Obj) -> Obj:
        """Create a custom object (its CRD installed if need be, from its apiVersion and kind); the server's object."""
        group, version = manifest["apiVersion"].split("/")
        kind = manifest["kind"]
        plural = kind.lower() + "s"
        try:
            await ApiextensionsV1Api(self.api).create_custom_resource_definition(crd(group, version, kind, plural))
        except ApiException as exc:
            if exc.status != 409:
                raise
        body = {**manifest, "metadata": {k: v for k, v in manifest["metadata"].items() if k != "uid"}}
        custom = CustomObjectsApi(self.api)

        async def create() -> Obj | None:
            try:
                return dict(await custom.create_namespaced_custom_object(group, version, self.ns, plural, body))
            except ApiException as exc:
                if exc.status == 404:  # the CRD is not served yet
                    return None
                raise

        created: Obj = await eventually(create)
        return created

    async def mpijob(self, name: str, workers: int, *, gpus: int = 1, queue: str = "q") -> tuple[Obj, list[Obj]]:
        """An MPIJob (v2beta1), its launcher Job and the pods the mpi-operator and the Job controller would create."""
        mpi = await self.custom(m.mpijob(name, self.ns, workers=workers))
        launcher = m.mpijob_launcher(mpi)
        del launcher["metadata"]["uid"]
        launcher["spec"]["template"] = {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
        }
        job = dict(self.api.sanitize_for_serialization(await self.batch.create_namespaced_job(self.ns, launcher)))
        labels = {"muster.dev/queue": queue}
        pods = m.mpijob_pods(mpi, job, requests={"worker": {"gpus": gpus}}, labels=labels, grace_seconds=0)
        return mpi, [await self.create_pod(p) for p in pods]

    async def pod_group(
        self,
        name: str,
        count: int,
        *,
        volcano: bool,
        min_member: Any = None,
        gpus: int = 1,
        labels: dict[str, str] | None = None,
        **group_args: Any,
    ) -> tuple[Obj, list[Obj]]:
        """A PodGroup (Volcano's or coscheduling's) of `min_member` (default `count`) and `count` bare pods in it."""
        group = await self.custom(
            m.pod_group(
                name, self.ns, min_member=count if min_member is None else min_member, volcano=volcano, **group_args
            )
        )
        pods = m.pod_group_pods(group, count, gpus=gpus, labels=labels, grace_seconds=0)
        return group, [await self.create_pod(p) for p in pods]

    async def controlled_gang(self, name: str, size: int, *, gpus: int = 1, queue: str = "q") -> tuple[Obj, list[Obj]]:
        """A labelled pod group whose pods name a controller of the user's own (an operator's `Trainer`) and
        that controller object: the pods as such an operator creates them (ownerReferences to its real uid)."""
        trainer = await self.custom({"apiVersion": "example.com/v1", "kind": "Trainer", "metadata": {"name": name}})
        meta = trainer["metadata"]
        owner = {
            "apiVersion": "example.com/v1",
            "kind": "Trainer",
            "name": name,
            "uid": meta["uid"],
            "controller": True,
        }
        return trainer, await self.gang(name, size, gpus=gpus, queue=queue, owner=owner)

    async def recreate(self, pods: list[Obj], *, suffix: str = "") -> list[Obj]:
        """Create `pods` again as their controller does once they are gone (new uids; names + `suffix`)."""
        out = []
        for pod in pods:
            meta = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations", "ownerReferences")}
            spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
            body = {"metadata": {**meta, "name": pod["metadata"]["name"] + suffix}, "spec": spec}
            out.append(await self.create_pod(body))
        return out

    async def delete_custom(self, obj: Obj) -> None:
        """Delete a custom object made by `custom` (its user deleting it; no garbage collector runs here)."""
        group, version = obj["apiVersion"].split("/")
        await CustomObjectsApi(self.api).delete_namespaced_custom_object(
            group, version, self.ns, obj["kind"].lower() + "s", obj["metadata"]["name"]
        )

    async def delete_jobset(self, name: str) -> None:
        await CustomObjectsApi(self.api).delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets", name
        )

    async def get_pod(self, name: str) -> Obj | None:
        try:
            return dict(self.api.sanitize_for_serialization(await self.core.read_namespaced_pod(name, self.ns)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def pod_node(self, name: str) -> str:
        pod = await self.get_pod(name)
        return str(((pod or {}).get("spec") or {}).get("nodeName") or "")

    async def delete_pod(self, name: str) -> None:
        """Delete a pod at once, as its kubelet confirming (or a user forcing) it."""
        await self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    async def set_phase(self, name: str, phase: str) -> None:
        """Report the pod's phase, as its kubelet would."""
        await self.core.patch_namespaced_pod_status(name, self.ns, {"status": {"phase": phase}}, _content_type=MERGE)

    async def gone(self, *names: str) -> bool:
        for name in names:
            if await self.get_pod(name) is not None:
                return False
        return True


async def _quiet(call: Awaitable[Any]) -> None:
    with contextlib.suppress(ApiException):
        await call
