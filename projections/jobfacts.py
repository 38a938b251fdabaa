"""What the core reads of a job and its priority class, as plain functions.

`JobState` and `ClusterState` are msgspec Structs, which stay Python (mypyc cannot compile them), so
their methods run interpreted even in the compiled core. The rules below are read millions of
times per run (victim orders, wake rules, class keys), so they live here, compiled, and the Structs'
methods of the same names call them: one rule, read from either side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from muster.projections.state import ClusterState, JobState


def priority_of(state: ClusterState, job: JobState) -> int:
    """The job's priority value; no class (or an unknown one) is the lowest class."""
    name = job.priority_class
    if name is not None:
        pc = state.priority_classes.get(name)
        if pc is not None:
            return pc.value
    return state.lowest_priority()


def preemptible(state: ClusterState, job: JobState) -> bool:
    """Whether the job's class lets it be preempted; no class is the lowest class (spec: a job's
    `priority_class` defaults to the lowest), as for its priority value."""
    name = job.priority_class
    if name is None:
        return state.lowest_preemptible()
    pc = state.priority_classes.get(name)
    return pc is None or pc.preemptible


def gpus(job: JobState) -> int:
    """The GPUs the job holds when admitted (a job on flavors holds `gpu@FLAVOR`, counted by its podsets)."""
    if not job.flavors:
        return job.requests.get("gpu", 0)
    return sum(v * ps.count for ps in job.podsets for k, v in ps.requests.items() if k == "gpu")


def progress(job: JobState, now: int) -> int:
    """Seconds of work done by `now`, counting the current run."""
    admitted_at = job.admitted_at
    if job.status == "admitted" and admitted_at is not None and now > admitted_at:
        return job.work_done + now - admitted_at
    return job.work_done


def lost_gpu_seconds(job: JobState, now: int) -> int:
    """GPU-seconds of work a preemption at `now` would destroy (the work since its last checkpoint)."""
    if job.status != "admitted":
        return 0
    done = progress(job, now)
    runtime = job.runtime
    if runtime is not None and runtime < done:
        done = runtime
    every = job.checkpoint_every
    return (done % every if every else done) * gpus(job)
