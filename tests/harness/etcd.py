"""A real etcd (the Debian etcd-server package's /usr/bin/etcd) on loopback: one member, a member
serving TLS, a member with authentication, or a cluster of several members.

Its data directory outlives `stop()`/`kill()`, so a restart serves the same keys. Healthy means
GET /health answers {"health": "true"} (the member has a leader and serves requests).

- `EtcdServer(dir, tls=EtcdTls(...))` serves its clients over https only and, with
  `client_cert_auth`, asks them for a certificate its CA signed (etcd's --client-cert-auth).
- `enable_auth(server, password)` adds the user root and turns authentication on (etcdctl, as an
  operator does); `extra_args` passes flags such as `--auth-token-ttl=1`.
- `EtcdCluster(dir, size)` runs `size` members that form one raft cluster; stopping one leaves a
  quorum serving the same keys on the others.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.procs import LOOPBACK, HarnessError, address_in_use, free_port
from tests.harness.servers import PORT_ATTEMPTS, START_TIMEOUT, ManagedServer

ETCD_BINARY = "/usr/bin/etcd"
ETCDCTL_BINARY = "/usr/bin/etcdctl"


def find_etcd(name: str = "etcd", default: str = ETCD_BINARY) -> str:
    path = shutil.which(name) or (default if Path(default).exists() else None)
    if path is None:
        raise HarnessError(f"{name} is not installed: run scripts/install-deps.sh")
    return path


@dataclass(frozen=True)
class EtcdTls:
    """A TLS member's files: its certificate and key, and the CA clients are checked against."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_auth: bool = True
    # What the harness itself presents (its health probe, etcdctl): a certificate `ca_file` signed.
    client_cert: Path | None = None
    client_key: Path | None = None


class EtcdServer(ManagedServer):
    name = "etcd"

    def __init__(
        self,
        base_dir: Path,
        *,
        tls: EtcdTls | None = None,
        extra_args: Sequence[str] = (),
        member_name: str = "kafscale-test",
        cluster: EtcdCluster | None = None,
    ) -> None:
        self.binary = find_etcd()
        self.tls = tls
        self.extra_args = list(extra_args)
        self.member_name = member_name
        self.cluster = cluster
        self.client_port = 0
        self.peer_port = 0
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        """host:port, the form KAFSCALE_ETCD_ENDPOINTS takes."""
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    def argv(self) -> list[str]:
        if self.cluster is not None:
            initial = self.cluster.initial_cluster()
            token = ["--initial-cluster-token", self.cluster.token]
        else:
            initial, token = f"{self.member_name}={self.peer_url}", []
        argv = [
            self.binary,
            f"--name={self.member_name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial}",
            *token,
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if self.tls is not None:
            argv += [
                f"--cert-file={self.tls.cert_file}",
                f"--key-file={self.tls.key_file}",
                f"--trusted-ca-file={self.tls.ca_file}",
                f"--client-cert-auth={'true' if self.tls.client_cert_auth else 'false'}",
            ]
        return argv + self.extra_args

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        if self.tls.client_cert is not None:
            context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def probe(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.url}/health", timeout=2.0, context=self._ssl_context()
            ) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("health") == "true")

    def etcdctl(self, *args: str, timeout: float = 30.0) -> str:
        """Run etcdctl against this member; its stdout, or HarnessError with its output."""
        argv = [find_etcd("etcdctl", ETCDCTL_BINARY), f"--endpoints={self.url}"]
        if self.tls is not None:
            argv.append(f"--cacert={self.tls.ca_file}")
            if self.tls.client_cert is not None:
                argv += [f"--cert={self.tls.client_cert}", f"--key={self.tls.client_key}"]
        result = subprocess.run(
            [*argv, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
        )
        if result.returncode != 0:
            raise HarnessError(f"etcdctl {' '.join(args)}: {result.stdout}{result.stderr}")
        return result.stdout

    # --- a tiny v3 JSON-gateway client, for tests that check the server itself ------------------

    def call(self, path: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """POST to the v3 JSON gateway (e.g. "kv/put"); keys and values are base64 in the body."""
        request = urllib.request.Request(
            f"{self.url}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=self._ssl_context()
            ) as response:
                result: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise HarnessError(f"etcd {path}: HTTP {exc.code}: {exc.read()!r}") from None
        return result

    def status(self) -> tuple[int, int]:
        """(this member's id, its leader's id; 0: none), from the JSON gateway's Status."""
        body = self.call("maintenance/status", {})
        return int(body["header"]["member_id"]), int(body.get("leader", 0))

    def put(self, key: bytes, value: bytes) -> None:
        self.call("kv/put", {"key": _b64(key), "value": _b64(value)})

    def get(self, key: bytes) -> bytes | None:
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs", [])
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def enable_auth(server: EtcdServer, root_password: str) -> None:
    """Add the user root (etcdctl grants it the root role) and turn authentication on."""
    server.etcdctl("user", "add", f"root:{root_password}")
    server.etcdctl("auth", "enable")


class EtcdCluster:
    """`size` etcd members forming one cluster on loopback; `endpoints` in member order."""

    def __init__(self, base_dir: Path, size: int = 3, extra_args: Sequence[str] = ()) -> None:
        self.token = f"kafscale-test-{uuid.uuid4().hex[:12]}"  # never joins a stray member
        self.members = [
            EtcdServer(
                base_dir / f"member-{index}",
                extra_args=extra_args,
                member_name=f"member-{index}",
                cluster=self,
            )
            for index in range(size)
        ]

    def initial_cluster(self) -> str:
        return ",".join(f"{m.member_name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def start_first(self, timeout: float = START_TIMEOUT) -> None:
        """Start every member (none is healthy before a quorum runs), then wait for each; a lost
        port race starts the whole cluster afresh on new ports."""
        __tracebackhide__ = True
        for attempt in range(1, PORT_ATTEMPTS + 1):
            # ManagedServer.start waits for health, which no member has before a quorum runs.
            for member in self.members:
                member._spawn()
            try:
                for member in self.members:
                    member._wait_healthy(timeout)
                return
            except HarnessError:
                lost_race = any(address_in_use(m.log_text()) for m in self.members)
                self.close()
                if not lost_race or attempt == PORT_ATTEMPTS:
                    raise
            for member in self.members:
                shutil.rmtree(member.data_dir, ignore_errors=True)  # it knew the old peer URLs
                member.data_dir.mkdir(parents=True)
                member.log_path.unlink(missing_ok=True)
                member.pick_ports()

    def leader(self) -> EtcdServer:
        """The member that leads now (asked of the running members)."""
        ids = {member.status()[0]: member for member in self.members if member.running}
        for member in ids.values():
            leader = member.status()[1]
            if leader in ids:
                return ids[leader]
        raise HarnessError("no running etcd member knows a leader")

    def move_leader(self, to: EtcdServer) -> None:
        """Hand the leadership to `to` (etcdctl move-leader, asked of the current leader)."""
        leader = self.leader()
        if leader is not to:
            leader.etcdctl("move-leader", format(to.status()[0], "x"))

    def close(self) -> None:
        for member in self.members:
            if member.pid is not None:
                member.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
