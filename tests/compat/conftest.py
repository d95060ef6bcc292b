"""Fixtures of the compatibility tests: one broker per test module (per xdist worker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.broker import BrokerFactory, BrokerProcess


@pytest.fixture(scope="module")
def kafscale(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """A broker on the embedded backends shared by a module's tests (each uses its own topics),
    with a short flush interval: acks=all, and so every read, waits for the flush."""
    factory = BrokerFactory(
        tmp_path_factory.mktemp("compat"),
        request.node.name,
        etcd=lambda: request.getfixturevalue("etcd_server"),
        s3=lambda: request.getfixturevalue("s3_server"),
    )
    try:
        yield factory({"KAFSCALE_FLUSH_INTERVAL_MS": "100"}, ready=True)
    finally:
        problems = factory.close()
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)
