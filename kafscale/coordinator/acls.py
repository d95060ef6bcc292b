"""The coordinator's side of CreateAcls and DeleteAcls (docs/design/security.md, section 6).

ACLs live at ``acls/{digest}`` (``AclRecord``; the digest is of the binding itself, so creating
a binding twice writes one key, as Kafka keeps a binding once). Any broker's coordinator may
write them; every broker's view follows the prefix and rebuilds its authorizer, so a change
applies everywhere within the views' lag.

- CreateAcls: the frontend has checked each binding (``authorizer.binding_error``); the puts go
  in one transaction.
- DeleteAcls: each filter selects bindings as Kafka's filters do (``authorizer.matching``); all
  the selected keys are deleted in one transaction that compares each key's revision, so a
  binding created meanwhile by another broker is never deleted unseen, and a lost race is read
  again (``ATTEMPTS`` times). Each filter's answer lists the bindings it removed.
"""

from __future__ import annotations

import logging

import msgspec

from kafscale.ipc.messages import (
    AclFilterValue,
    AclsChanged,
    AclValue,
    CreateAcls,
    DeleteAcls,
)
from kafscale.ipc.rpc import Handler, Incoming
from kafscale.metadata import records
from kafscale.metadata.records import AclRecord, Keys
from kafscale.metadata.store import Compare, Delete, MetadataStore, Put
from kafscale.protocol.acls import AclOperation
from kafscale.security.authorizer import (
    AclBinding,
    AclBindingFilter,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding_from_codes,
    from_code,
)

log = logging.getLogger(__name__)

ATTEMPTS = 5


class AclsChangedConcurrently(Exception):
    """DeleteAcls lost its race ``ATTEMPTS`` times in a row."""


def record_of(value: AclValue) -> AclRecord:
    return AclRecord(
        value.resource_type,
        value.resource_name,
        value.pattern_type,
        value.principal,
        value.host,
        value.operation,
        value.permission_type,
    )


def value_of(record: AclRecord) -> AclValue:
    return AclValue(
        record.resource_type,
        record.resource_name,
        record.pattern_type,
        record.principal,
        record.host,
        record.operation,
        record.permission_type,
    )


def binding_of(record: AclRecord | AclValue) -> AclBinding:
    return binding_from_codes(*msgspec.structs.astuple(record))


def filter_of(value: AclFilterValue) -> AclBindingFilter:
    return AclBindingFilter(
        from_code(ResourceType, value.resource_type),
        value.resource_name,
        from_code(PatternType, value.pattern_type),
        value.principal,
        value.host,
        from_code(AclOperation, value.operation),
        from_code(AclPermissionType, value.permission_type),
    )


class AclAdmin:
    def __init__(self, store: MetadataStore, namespace: str) -> None:
        self.store = store
        self.keys = Keys(namespace)

    def handlers(self) -> dict[type, Handler]:
        return {CreateAcls: self.handle_create, DeleteAcls: self.handle_delete}

    def handle_create(self, incoming: Incoming) -> AclsChanged:
        assert isinstance(incoming.message, CreateAcls)
        return self.create(incoming.message)

    def handle_delete(self, incoming: Incoming) -> AclsChanged:
        assert isinstance(incoming.message, DeleteAcls)
        return self.delete(incoming.message)

    def create(self, request: CreateAcls) -> AclsChanged:
        puts = {}
        for value in request.bindings:
            record = record_of(value)
            puts[self.keys.acl(record)] = Put(self.keys.acl(record), records.encode(record))
        if not puts:
            return AclsChanged([], 0)
        txn = self.store.transaction([], list(puts.values()))
        for value in request.bindings:
            log.info("ACL created", extra={"acl": _describe(value)})
        return AclsChanged([], txn.revision)

    def delete(self, request: DeleteAcls) -> AclsChanged:
        filters = [filter_of(value) for value in request.filters]
        for _ in range(ATTEMPTS):
            present: dict[str, tuple[AclRecord, int]] = {}
            for kv in self.store.get_prefix(self.keys.acls):
                try:
                    present[kv.key] = (records.decode_acl(kv.value), kv.mod_revision)
                except ValueError:
                    log.error("skipping an undecodable ACL record", extra={"key": kv.key})
            deleted: list[list[AclValue]] = []
            doomed: dict[str, int] = {}
            for acl_filter in filters:
                mine = []
                for key, (record, revision) in present.items():
                    if acl_filter.matches(binding_of(record)):
                        mine.append(value_of(record))
                        doomed[key] = revision
                deleted.append(mine)
            if not doomed:
                return AclsChanged(deleted, 0)
            txn = self.store.transaction(
                [Compare(key, mod_revision=revision) for key, revision in doomed.items()],
                [Delete(key) for key in doomed],
            )
            if txn.succeeded:
                for values in deleted:
                    for value in values:
                        log.info("ACL deleted", extra={"acl": _describe(value)})
                return AclsChanged(deleted, txn.revision)
        raise AclsChangedConcurrently("the ACLs kept changing during DeleteAcls; retry")


def _describe(value: AclValue) -> str:
    binding = binding_of(value)
    return (
        f"{binding.permission_type.name} {binding.principal} from {binding.host} "
        f"{binding.operation.name} on {binding.resource_type.name} "
        f"{binding.pattern_type.name} {binding.resource_name!r}"
    )
