"""RPC errors name the peer, not the socket path in the broker's runtime directory: their text
reaches Kafka clients in error messages (e.g. a Produce that a shard did not answer)."""

from pathlib import Path

import pytest
import zmq

from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import PeerUnavailable, RpcClient, RpcTimeout, peer_name


def test_peer_names() -> None:
    assert peer_name(endpoints.address("/tmp/kafscale-run-x1", "shard", 3)) == "shard-3"
    assert peer_name("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"


def test_errors_do_not_reveal_the_runtime_directory(tmp_path: Path) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    address = endpoints.address(str(tmp_path), "shard", 0)
    client = RpcClient(context, address)
    try:
        with pytest.raises(PeerUnavailable) as absent:
            client.call(messages.Ping(), timeout_ms=50)
        assert str(absent.value) == "nothing listens on shard-0"
        silent = context.socket(zmq.ROUTER)  # bound, never answers
        silent.bind(address)
        try:
            with pytest.raises(RpcTimeout) as timed_out:
                client.call(messages.Ping(), timeout_ms=300)
            assert str(timed_out.value) == "no reply from shard-0 within 300 ms"
            assert str(tmp_path) not in str(timed_out.value)
        finally:
            silent.close(linger=0)
    finally:
        client.close()
        context.term()
