"""The coordinator answers ErrorReply for a request whose handler fails, instead of exiting."""

from __future__ import annotations

import logging

import pytest

from kafscale.coordinator.process import contained
from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.metadata.store import MetadataStoreUnavailable
from kafscale.storage.objects import ObjectStoreUnavailable


def incoming(message: messages.Message) -> Incoming:
    return Incoming(b"peer", b"\0" * 8, message)


def test_a_handler_that_succeeds_is_answered_as_before() -> None:
    handlers = contained({messages.Ping: lambda _: messages.ErrorReply(message="as is")})
    assert handlers[messages.Ping](incoming(messages.Ping())) == messages.ErrorReply(
        message="as is"
    )


@pytest.mark.parametrize(
    "error",
    [
        MetadataStoreUnavailable("etcd at 127.0.0.1:2379 is unreachable"),
        ObjectStoreUnavailable("S3 endpoint http://x is unreachable"),
    ],
)
def test_a_backend_outage_is_an_error_reply(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(_: Incoming) -> messages.Message:
        raise error

    with caplog.at_level(logging.DEBUG):
        reply = contained({messages.Ping: fail})[messages.Ping](incoming(messages.Ping()))
    assert isinstance(reply, messages.ErrorReply)
    assert reply.message == f"a backend is unavailable: {error}"
    assert not caplog.records  # the store's outage gate logs the outage, once


def test_a_bug_is_an_error_reply_with_its_traceback_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(_: Incoming) -> messages.Message:
        raise KeyError("boom")

    reply = contained({messages.Ping: fail})[messages.Ping](incoming(messages.Ping()))
    assert reply == messages.ErrorReply(message="KeyError: 'boom'")
    [record] = [r for r in caplog.records if r.getMessage() == "request failed"]
    assert record.exc_info is not None


def test_a_handler_that_answers_later_still_answers_nothing_now() -> None:
    handlers = contained({messages.Ping: lambda _: None})
    assert handlers[messages.Ping](incoming(messages.Ping())) is None
