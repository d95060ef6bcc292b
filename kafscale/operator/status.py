"""Status conditions (docs/design/operator.md, section 6). Pure.

Every resource carries ``Ready`` and, for clusters, ``Degraded`` and ``Reconciling``, each with
a reason and a message. A condition's ``lastTransitionTime`` moves only when its status changes,
as Kubernetes' conventions ask (kubectl wait --for=condition=Ready relies on the type and status).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafscale.operator.model import Cluster

Condition = dict[str, Any]


@dataclass(frozen=True)
class Cond:
    type: str
    status: bool
    reason: str
    message: str


def conditions(
    new: list[Cond], previous: list[Condition] | None, generation: int, now: str
) -> list[Condition]:
    """The conditions as the status holds them, keeping each one's transition time when its
    status did not change."""
    before = {c.get("type"): c for c in previous or []}
    out: list[Condition] = []
    for cond in new:
        status = "True" if cond.status else "False"
        old = before.get(cond.type)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        out.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": since or now,
                "observedGeneration": generation,
            }
        )
    return out


@dataclass(frozen=True)
class Workload:
    """A StatefulSet's status as observed (None fields: it does not exist yet)."""

    replicas: int  # spec.replicas
    status_replicas: int
    ready: int
    updated: int
    current_generation: bool  # status.observedGeneration == metadata.generation


def workload(sts: dict[str, Any] | None) -> Workload | None:
    if sts is None:
        return None
    spec = sts.get("spec") or {}
    status = sts.get("status") or {}
    generation = int((sts.get("metadata") or {}).get("generation") or 0)
    return Workload(
        replicas=int(spec.get("replicas", 1)),
        status_replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        current_generation=int(status.get("observedGeneration") or 0) >= generation,
    )


def cluster_conditions(
    cluster: Cluster,
    brokers: Workload | None,
    etcd_members: Workload | None,
    scaling: str,
    notes: list[str],
    error: str | None,
) -> list[Cond]:
    """Ready, Degraded and Reconciling for a cluster.

    ``scaling``: why the applied broker count is not the spec's yet (cluster.broker_replicas);
    ``notes``: what the operator could not carry out but works around (kept etcd size);
    ``error``: the reconcile failed (an invalid spec, an API error), the message says why.
    """
    problems: list[tuple[str, str]] = []
    if error is not None:
        problems.append(("ReconcileFailed", error))
    want = brokers.replicas if brokers is not None else cluster.spec.brokers.replicas
    ready = brokers.ready if brokers is not None else 0
    if brokers is None:
        problems.append(("BrokersNotCreated", "the broker StatefulSet does not exist yet"))
    elif ready < want:
        problems.append(("BrokersNotReady", f"{ready} of {want} brokers are ready"))
    managed = cluster.spec.metadata.etcd.managed
    if managed is not None:
        members = etcd_members.replicas if etcd_members is not None else managed.replicas
        up = etcd_members.ready if etcd_members is not None else 0
        if up < members:
            quorum = members // 2 + 1
            state = "has a quorum" if up >= quorum else "has no quorum"
            problems.append(("EtcdNotReady", f"{up} of {members} etcd members are ready ({state})"))
    for note in notes:
        problems.append(("SpecNotApplied", note))
    rolling = brokers is not None and (not brokers.current_generation or brokers.updated < want)
    reconciling: Cond
    if scaling:
        reconciling = Cond("Reconciling", True, "ScalingDown", scaling)
    elif rolling:
        reconciling = Cond(
            "Reconciling",
            True,
            "RollingUpdate",
            f"{brokers.updated if brokers else 0} of {want} brokers run the latest spec",
        )
    else:
        reconciling = Cond("Reconciling", False, "UpToDate", "the objects match the spec")
    if problems:
        reason, message = problems[0]
        ready_cond = Cond("Ready", False, reason, "; ".join(m for _, m in problems))
        # Degraded: something runs but not all of it; not Ready with nothing running is not
        # "degraded", it is not up (yet).
        serving = ready > 0 and error is None
        degraded = Cond(
            "Degraded",
            serving,
            reason if serving else "NotServing",
            message if serving else "no broker is ready",
        )
        return [ready_cond, degraded, reconciling]
    return [
        Cond("Ready", True, "AllReady", f"{ready} brokers ready"),
        Cond("Degraded", False, "AllReady", "every broker and etcd member is ready"),
        reconciling,
    ]
