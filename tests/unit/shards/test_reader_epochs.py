"""Leader epochs on the shard's read path: OffsetForLeaderEpoch queries answered from the
partition's epoch history, and ListOffsets answers naming the epoch that wrote each offset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.partition import PartitionLog, StaleTopic
from kafscale.shards.reader import ReadPath
from tests.unit.shards.test_reader import T0, TOPIC, TOPIC_ID, Rig

# Epoch 0 wrote offsets 0-2, epoch 2 offsets 3-4, epoch 5 (the current one) from 5 on.
EPOCHS = [(0, 0), (2, 3), (5, 5)]


@pytest.fixture
def rig(tmp_path: Any) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    made.close()


def epoch_ends(rig: Rig, *leader_epochs: int) -> list[tuple[int, int, int]]:
    """(error, epoch, end offset) for each epoch asked, all in one request."""
    queries = [
        messages.OffsetQuery(TOPIC, TOPIC_ID, 0, timestamp=-1, leader_epoch=epoch)
        for epoch in leader_epochs
    ]
    request = messages.ListOffsets(queries)
    rig.reader.on_list_offsets(Incoming(b"frontend", b"r", request), request)
    [(message, bulk)] = rig.replies.sent  # answered at once: no object-store read
    rig.replies.sent.clear()
    assert isinstance(message, messages.OffsetsListed) and bulk == []
    return [(a.error_code, a.leader_epoch, a.offset) for a in message.results]


def written_in_three_epochs(rig: Rig) -> None:
    """Five committed records, then one more in the buffer (unflushed), at EPOCHS."""
    rig.append(b"a", b"b", b"c", timestamp=T0)
    rig.flush()
    rig.append(b"d", b"e", timestamp=T0 + 10)
    rig.flush()
    rig.partition.leader_epoch, rig.partition.epochs = 5, list(EPOCHS)
    rig.append(b"f", timestamp=T0 + 20)


def test_offset_for_leader_epoch_from_the_epoch_history(rig: Rig) -> None:
    written_in_three_epochs(rig)
    assert epoch_ends(rig, 0, 1, 2, 3, 5, 6, -1) == [
        (0, 0, 3),  # epoch 0 ends where epoch 2 starts
        (0, 0, 3),  # never a leader epoch here: the one below it
        (0, 2, 5),
        (0, 2, 5),
        (0, 5, 5),  # the current epoch ends at the high watermark, not at the buffered record
        (0, -1, -1),  # newer than this leader knows
        (0, -1, -1),
    ]


def test_the_current_epoch_ends_at_the_log_end_when_unflushed_data_is_served(
    tmp_path: Any,
) -> None:
    rig = Rig(tmp_path, KAFSCALE_FETCH_UNFLUSHED="true")
    try:
        written_in_three_epochs(rig)
        # A consumer may have read the buffered record: its position (6) must not look truncated.
        assert epoch_ends(rig, 5, 2) == [(0, 5, 6), (0, 2, 5)]
    finally:
        rig.close()


def test_list_offsets_names_the_epoch_that_wrote_each_offset(rig: Rig) -> None:
    written_in_three_epochs(rig)
    answers = rig.list_offsets(-1, -2, T0 + 1, T0 + 10, -3)
    assert [(a.error_code, a.offset, a.leader_epoch) for a in answers] == [
        (0, 5, 5),  # latest: the high watermark, in the current epoch
        (0, 0, 0),  # earliest
        (0, 1, 0),
        (0, 3, 2),
        (0, 4, 2),  # max timestamp (of the committed log): "e"
    ]


def test_an_epoch_query_for_a_replaced_topic_is_unknown(rig: Rig) -> None:
    def replaced(*_: object) -> PartitionLog:
        raise StaleTopic("a newer topic of the same name replaced it")

    rig.reader.close()
    rig.reader = ReadPath(rig.config, rig.store, rig.replies, replaced, "0", rig.clock)  # type: ignore[arg-type]
    assert epoch_ends(rig, 0) == [(ErrorCode.unknown_topic_or_partition, -1, -1)]
