"""Status conditions of the operator's resources (kafscale/operator/status.py) and the operator's
own settings (kafscale/operator/settings.py, documented in docs/kubernetes.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kafscale.operator import settings, status
from kafscale.operator.model import Cluster, parse_cluster

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def make_cluster(**spec: Any) -> Cluster:
    body = {
        "storage": {"bucket": "bucket"},
        "metadata": {"etcd": {"endpoints": ["etcd:2379"]}},
        **spec,
    }
    return parse_cluster(
        {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "spec": body}, "img"
    )


def workload(replicas: int, ready: int, updated: int | None = None) -> status.Workload:
    return status.Workload(
        replicas=replicas,
        status_replicas=replicas,
        ready=ready,
        updated=replicas if updated is None else updated,
        current_generation=True,
    )


def by_type(conds: list[status.Cond]) -> dict[str, status.Cond]:
    return {c.type: c for c in conds}


def test_all_ready() -> None:
    conds = by_type(status.cluster_conditions(make_cluster(), workload(3, 3), None, "", [], None))
    assert (conds["Ready"].status, conds["Ready"].reason) == (True, "AllReady")
    assert conds["Degraded"].status is False
    assert (conds["Reconciling"].status, conds["Reconciling"].reason) == (False, "UpToDate")


def test_some_brokers_ready_is_degraded_none_is_not_serving() -> None:
    some = by_type(status.cluster_conditions(make_cluster(), workload(3, 2), None, "", [], None))
    assert (some["Ready"].status, some["Ready"].reason) == (False, "BrokersNotReady")
    assert "2 of 3 brokers are ready" in some["Ready"].message
    assert (some["Degraded"].status, some["Degraded"].reason) == (True, "BrokersNotReady")
    none = by_type(status.cluster_conditions(make_cluster(), workload(3, 0), None, "", [], None))
    assert (none["Degraded"].status, none["Degraded"].reason) == (False, "NotServing")


def test_no_statefulset_yet() -> None:
    conds = by_type(status.cluster_conditions(make_cluster(), None, None, "", [], None))
    assert conds["Ready"].reason == "BrokersNotCreated"


def test_etcd_members_and_quorum() -> None:
    cluster = make_cluster(metadata={"etcd": {"managed": {"replicas": 3}}})
    one = by_type(status.cluster_conditions(cluster, workload(3, 3), workload(3, 1), "", [], None))
    assert one["Ready"].reason == "EtcdNotReady"
    assert "1 of 3 etcd members are ready (has no quorum)" in one["Ready"].message
    two = by_type(status.cluster_conditions(cluster, workload(3, 3), workload(3, 2), "", [], None))
    assert "(has a quorum)" in two["Ready"].message
    assert two["Degraded"].status is True


def test_an_error_comes_first_and_is_not_serving() -> None:
    conds = by_type(status.cluster_conditions(make_cluster(), workload(3, 3), None, "", [], "boom"))
    assert (conds["Ready"].status, conds["Ready"].reason) == (False, "ReconcileFailed")
    assert conds["Ready"].message.startswith("boom")


def test_reconciling_scale_down_and_rolling_update() -> None:
    scaling = by_type(
        status.cluster_conditions(make_cluster(), workload(3, 3), None, "waiting", [], None)
    )
    assert (scaling["Reconciling"].status, scaling["Reconciling"].reason) == (True, "ScalingDown")
    rolling = by_type(
        status.cluster_conditions(make_cluster(), workload(3, 3, updated=1), None, "", [], None)
    )
    assert rolling["Reconciling"].reason == "RollingUpdate"
    assert "1 of 3 brokers run the latest spec" in rolling["Reconciling"].message


def test_notes_are_said() -> None:
    conds = by_type(
        status.cluster_conditions(make_cluster(), workload(1, 1), None, "", ["kept 3"], None)
    )
    assert (conds["Ready"].status, conds["Ready"].reason) == (False, "SpecNotApplied")


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = status.conditions([status.Cond("Ready", False, "A", "a")], None, 1, "T1")
    assert first[0]["lastTransitionTime"] == "T1"
    same = status.conditions([status.Cond("Ready", False, "B", "b")], first, 2, "T2")
    assert same[0]["lastTransitionTime"] == "T1"
    assert (same[0]["reason"], same[0]["observedGeneration"]) == ("B", 2)
    flipped = status.conditions([status.Cond("Ready", True, "C", "c")], same, 2, "T3")
    assert (flipped[0]["status"], flipped[0]["lastTransitionTime"]) == ("True", "T3")


def test_workload_reads_a_statefulset() -> None:
    sts = {
        "metadata": {"generation": 4},
        "spec": {"replicas": 3},
        "status": {
            "replicas": 3,
            "readyReplicas": 2,
            "updatedReplicas": 1,
            "observedGeneration": 3,
        },
    }
    found = status.workload(sts)
    assert found == status.Workload(3, 3, 2, 1, current_generation=False)
    assert status.workload(None) is None
    assert status.workload({"metadata": {}, "spec": {}}) == status.Workload(1, 0, 0, 0, True)


# --- settings ----------------------------------------------------------------------------------


def test_settings_defaults_and_parsing() -> None:
    loaded = settings.load({})
    assert loaded.namespaces == ()
    assert loaded.health_port == 8080
    assert loaded.resync_seconds == 60
    custom = settings.load(
        {
            "KAFSCALE_OPERATOR_NAMESPACES": " a, b ,",
            "KAFSCALE_OPERATOR_ADDRESS_MAP": "x.svc:9092=127.0.0.1:1,y:1=z:2",
        }
    )
    assert custom.namespaces == ("a", "b")
    assert custom.address("x.svc:9092") == "127.0.0.1:1"
    assert custom.address("other:1") == "other:1"


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("KAFSCALE_OPERATOR_HEALTH_PORT", "http", "is not a number"),
        ("KAFSCALE_OPERATOR_RESYNC_SECONDS", "0", "is not between"),
        ("KAFSCALE_OPERATOR_ADDRESS_MAP", "a=b", "is not host:port=host:port"),
        ("KAFSCALE_OPERATOR_BROKER_IMAGE", " ", "empty"),
    ],
)
def test_bad_settings_name_the_variable(env: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"{env}.*{message}"):
        settings.load({env: value})


def test_every_operator_setting_is_documented_with_its_default() -> None:
    text = DOCS.read_text()
    for setting in settings.SETTINGS:
        row = re.search(rf"^\| `{setting.env}` \| ([^|]*) \|", text, re.MULTILINE)
        assert row is not None, f"{setting.env} is not in docs/kubernetes.md's settings table"
        shown = row.group(1).strip().strip("`")
        assert shown == (setting.default or "(all)") or (
            not setting.default and shown == "(none)"
        ), f"{setting.env}: documented default {shown!r}, real {setting.default!r}"
