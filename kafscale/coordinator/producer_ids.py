"""Producer ids, unique across brokers and restarts.

The coordinator reserves blocks of ids with a compare-and-set on one counter key in the metadata
store (as Kafka's controller hands out AllocateProducerIds blocks) and gives them out one by one.
Ids of a block not used before a restart are skipped, never reused.
"""

from __future__ import annotations

from kafscale.ipc.messages import AllocateProducerId, ProducerIdAllocated
from kafscale.ipc.rpc import Incoming
from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, MetadataStore, MetadataStoreError, Put

BLOCK_SIZE = 1000
MAX_ATTEMPTS = 20


class ProducerIdAllocator:
    def __init__(self, store: MetadataStore, namespace: str, block_size: int = BLOCK_SIZE) -> None:
        self.store = store
        self.key = Keys(namespace).root + "producer_ids"
        self.block_size = block_size
        self._next = 0
        self._end = 0  # exclusive end of the reserved block

    def handle(self, incoming: Incoming) -> ProducerIdAllocated:
        assert isinstance(incoming.message, AllocateProducerId)
        return ProducerIdAllocated(producer_id=self.allocate())

    def allocate(self) -> int:
        if self._next >= self._end:
            self._reserve()
        producer_id = self._next
        self._next += 1
        return producer_id

    def _reserve(self) -> None:
        for _ in range(MAX_ATTEMPTS):
            current = self.store.get(self.key)
            start = int(current.value) if current is not None else 0
            end = start + self.block_size
            txn = self.store.transaction(
                [Compare(self.key, mod_revision=current.mod_revision if current else 0)],
                [Put(self.key, str(end).encode())],
            )
            if txn.succeeded:
                self._next, self._end = start, end
                return
        raise MetadataStoreError("could not reserve a block of producer ids: too much contention")
