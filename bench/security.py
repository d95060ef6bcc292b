"""SASL_SSL for the benchmark's targets and clients (issue 17): both brokers get a SASL_SSL
listener with SCRAM-SHA-512 and one user, and every client of a run (Kafka's tools,
confluent-kafka, the admin client that creates topics) connects to it with that user.

- Certificates: tests/harness/tls.py's `make_pki` in the target's work directory (a CA, a
  server certificate for 127.0.0.1 and localhost, EC P-256, key in unencrypted PKCS#8 PEM).
- KafScale: two listeners, PLAIN (PLAINTEXT, on KAFSCALE_BROKER_PORT, where the test harness
  expects one) and SECURE (SASL_SSL, the clients' bootstrap); the user is the first admin
  (KAFSCALE_SASL_ADMIN_USER/_PASSWORD: SCRAM-SHA-256 and -512 credentials, 4,096 iterations).
- Kafka: its PLAINTEXT (inter-broker) and CONTROLLER listeners stay; a SASL_SSL listener is added
  with a PEM keystore (`ssl.keystore.type=PEM`, key and chain in one file at
  ssl.keystore.location, no key password) and SCRAM-SHA-512 through the listener's
  `listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config`; the user is written into the
  cluster's metadata when the log directory is formatted (`kafka-storage format --add-scram`,
  4,096 iterations).

Both brokers enable SCRAM-SHA-512 alone, ask for no client certificate, and use their TLS
defaults (TLS 1.2 and 1.3; what a client negotiates is recorded by `tls_session`).
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from tests.harness.tls import make_pki

PLAINTEXT = "plaintext"
SASL_SSL = "sasl_ssl"
CHOICES = (PLAINTEXT, SASL_SSL)
# How each is labelled in the results ("security" of a measurement).
LABELS = {PLAINTEXT: "PLAINTEXT", SASL_SSL: "SASL_SSL"}
MECHANISM = "SCRAM-SHA-512"
USER = "bench"
PASSWORD = "bench-secret-0"
SCRAM_ITERATIONS = 4096  # Kafka's minimum and default; KafScale's first admin gets the same
LISTENER = "SECURE"  # KafScale's name for its SASL_SSL listener (Kafka's is SASL_SSL)


@dataclass(frozen=True)
class SaslSsl:
    """One run's certificates and SCRAM user, and the settings each side needs for them."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    keystore_file: Path  # the key, then the certificate: Kafka's PEM keystore file
    java_properties: Path  # `java()` as a properties file, for the tools' --command-config
    user: str = USER
    password: str = PASSWORD
    mechanism: str = MECHANISM

    label = LABELS[SASL_SSL]

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka's settings (producer, consumer, admin client)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": self.mechanism,
            "sasl.username": self.user,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.ca_file),
        }

    def java(self) -> dict[str, str]:
        """The Java clients' settings (Kafka's tools read them from `java_properties`:
        ProducerPerformance refuses a --command-property whose value contains "=", as the JAAS
        line does)."""
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.user}" password="{self.password}";'
        )
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.mechanism,
            "sasl.jaas.config": jaas,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
        }

    def kafscale_env(self, plain_port: int, secure_port: int) -> dict[str, str]:
        """KAFSCALE_* settings of a broker with a PLAINTEXT and a SASL_SSL listener."""
        return {
            "KAFSCALE_BROKER_PORT": str(plain_port),
            "KAFSCALE_LISTENERS": (
                f"PLAIN://127.0.0.1:{plain_port},{LISTENER}://127.0.0.1:{secure_port}"
            ),
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": f"PLAIN:PLAINTEXT,{LISTENER}:SASL_SSL",
            "KAFSCALE_SSL_CERT_FILE": str(self.cert_file),
            "KAFSCALE_SSL_KEY_FILE": str(self.key_file),
            "KAFSCALE_SASL_ENABLED_MECHANISMS": self.mechanism,
            "KAFSCALE_SASL_ADMIN_USER": self.user,
            "KAFSCALE_SASL_ADMIN_PASSWORD": self.password,
        }

    def kafka_properties(self) -> dict[str, str]:
        """server.properties entries of Kafka's SASL_SSL listener (named SASL_SSL; the caller
        adds it to listeners, advertised.listeners and the protocol map)."""
        prefix = "listener.name.sasl_ssl."
        return {
            "sasl.enabled.mechanisms": self.mechanism,
            f"{prefix}sasl.enabled.mechanisms": self.mechanism,
            f"{prefix}{self.mechanism.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file),
        }

    def kafka_format_args(self) -> list[str]:
        """`kafka-storage format` arguments that create the user's SCRAM credential."""
        return [
            "--add-scram",
            f"{self.mechanism}=[name={self.user},password={self.password},"
            f"iterations={SCRAM_ITERATIONS}]",
        ]

    def describe(self) -> str:
        return (
            f"{self.mechanism} (user `{self.user}`, {SCRAM_ITERATIONS} iterations), "
            "TLS with a server certificate for 127.0.0.1 (EC P-256, signed by a CA made for the "
            "run by tests/harness/tls.py), no client certificate; the clients verify the server "
            "against that CA"
        )


def make_sasl_ssl(directory: Path) -> SaslSsl:
    """Certificates in `directory` (made for this run) and the settings that use them."""
    pki = make_pki(directory)
    keystore = directory / "server-keystore.pem"
    keystore.write_bytes(pki.server_key.read_bytes() + pki.server_cert.read_bytes())
    security = SaslSsl(
        ca_file=pki.ca_file,
        cert_file=pki.server_cert,
        key_file=pki.server_key,
        keystore_file=keystore,
        java_properties=directory / "client.properties",
    )
    lines = [f"{key}={value}" for key, value in security.java().items()]
    security.java_properties.write_text("\n".join(lines) + "\n")
    return security


def tls_session(address: str, ca_file: Path, timeout: float = 10.0) -> str:
    """The protocol version and cipher an OpenSSL client (Python's ssl, as librdkafka's
    OpenSSL would) negotiates with the listener at host:port, e.g. "TLSv1.3
    TLS_AES_256_GCM_SHA384"."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((host, int(port)), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        cipher = tls.cipher()
        return f"{tls.version()} {cipher[0] if cipher else 'unknown'}"
