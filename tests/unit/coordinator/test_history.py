"""The coordinator's metadata history compaction: every interval, compact to the revision seen
one interval before (so the last interval's history is always kept); an outage skips a round."""

from __future__ import annotations

from kafscale.coordinator.history import HistoryCompactor
from kafscale.metadata.store import MetadataStoreUnavailable


class Store:
    """Revisions and the compactions asked for (the scheduling only: the stores' ``compact``
    is tested against SQLite and a real etcd in tests/unit/metadata)."""

    def __init__(self) -> None:
        self.current = 10
        self.compacted: list[int] = []
        self.down = False

    def revision(self) -> int:
        if self.down:
            raise MetadataStoreUnavailable("down")
        return self.current

    def compact(self, revision: int) -> None:
        if self.down:
            raise MetadataStoreUnavailable("down")
        self.compacted.append(revision)


def test_each_round_compacts_to_the_revision_the_round_before_saw() -> None:
    store = Store()
    history = HistoryCompactor(store, interval_ms=1000)  # type: ignore[arg-type]
    history.maybe_run(0)  # the first round only takes note: nothing is a round old yet
    assert store.compacted == []
    store.current = 50
    history.maybe_run(999)  # not yet
    assert store.compacted == []
    history.maybe_run(1000)
    assert store.compacted == [10]
    store.current = 90
    history.maybe_run(2000)
    assert store.compacted == [10, 50]


def test_an_outage_skips_a_round_and_the_next_goes_on() -> None:
    store = Store()
    history = HistoryCompactor(store, interval_ms=1000)  # type: ignore[arg-type]
    history.maybe_run(0)
    store.down = True
    history.maybe_run(1000)  # logged, not raised
    store.down, store.current = False, 70
    history.maybe_run(2000)
    assert store.compacted == [10]
    history.maybe_run(3000)
    assert store.compacted == [10, 70]


def test_interval_zero_leaves_it_to_etcd() -> None:
    store = Store()
    history = HistoryCompactor(store, interval_ms=0)  # type: ignore[arg-type]
    for now in range(0, 10_000, 1000):
        history.maybe_run(now)
    assert store.compacted == []
