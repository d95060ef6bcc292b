"""The ``kafscale`` command. ``kafscale serve`` runs a broker; every setting is a flag and a
``KAFSCALE_*`` variable (flags win), listed with ``kafscale serve --help`` -- except credentials,
which come from a variable or a file only: given as a flag, ``serve`` refuses to start and names
the variable to use (argv is readable by every user of the machine)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from kafscale import config as configuration
from kafscale import logs

VERSION = "0.1.0"


class _RefusedSecretFlag(argparse.Action):
    """A credential given as a flag: stop with the variable to use instead (the flag is hidden
    from --help; it exists so that the refusal is clear, abbreviations included)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setting = configuration.SETTINGS_BY_FIELD[self.dest]
        parser.error(configuration.flag_refused(setting))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafscale", description="A Kafka-protocol broker backed by S3 and etcd"
    )
    parser.add_argument("--version", action="version", version=f"kafscale {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    credentials = ", ".join(s.env for s in configuration.SETTINGS if s.secret)
    serve = commands.add_parser(
        "serve",
        help="run a broker",
        description="Run a broker. Each flag overrides its variable.",
        epilog=f"Credentials ({credentials}) have no flag: set the variable, or VARIABLE_FILE "
        "to a file holding the value.",
    )
    for setting in configuration.SETTINGS:
        if setting.secret:
            serve.add_argument(setting.flag, dest=setting.field, action=_RefusedSecretFlag)
            continue
        serve.add_argument(
            setting.flag,
            dest=setting.field,
            metavar="VALUE",
            default=None,
            help=f"{setting.help} [{setting.env}, default {setting.default!r}]",
        )
    segments = commands.add_parser("segments", help="inspect segment objects")
    segment_commands = segments.add_subparsers(dest="segments_command", required=True)
    dump = segment_commands.add_parser(
        "dump",
        help="print a .kfs/.index/.wal object and verify every CRC",
        description="Print a segment's header, batches and footer (an index's entries, or a "
        "write-ahead object's header, directory and footer) and "
        "verify every CRC. The argument is a local file or, if no such file exists, an object "
        "key read through the configured object store (KAFSCALE_* variables). Exit status: 0 "
        "all verified, 1 corrupt, 2 unreadable.",
    )
    dump.add_argument("target", metavar="FILE_OR_KEY")
    dump.add_argument(
        "--records",
        action="store_true",
        help="also print the batches and records of each chunk of a write-ahead (.wal) object",
    )
    listing = segment_commands.add_parser(
        "list",
        help="print a partition's committed log (segments and write-ahead chunks)",
        description="Print a partition's committed state and every entry of its log from the "
        "configured metadata store: a segment with its object key, a chunk with the write-ahead "
        "object and byte range holding it. Exit status: 0 listed, 1 no such partition, 2 the "
        "store could not be read.",
    )
    listing.add_argument("topic")
    listing.add_argument("partition", type=int)
    flush = commands.add_parser(
        "flush",
        help="seal and commit every buffer of a running broker now",
        description="Ask a running broker to seal every partition buffer and wait until all of "
        "it is committed to S3 (POST /flush on its metrics port). The broker's admin token is "
        "read from KAFSCALE_ADMIN_TOKEN or the file KAFSCALE_ADMIN_TOKEN_FILE names. Exit "
        "status 0 on success.",
    )
    flush.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9093",
        help="the broker's metrics endpoint [default: %(default)s]",
    )
    drain = commands.add_parser(
        "drain",
        help="hand every partition of a running broker over to the other brokers",
        description="Ask a running broker to hand every partition over to the other brokers of "
        "its cluster (each sealed, committed and released) and to take no more (POST /drain on "
        "its metrics port): a Kubernetes preStop hook, before the pod is stopped. The broker "
        "keeps running, owning nothing, until it is stopped. The broker's admin token is read "
        "from KAFSCALE_ADMIN_TOKEN or the file KAFSCALE_ADMIN_TOKEN_FILE names. Exit status 0 "
        "once everything is handed over.",
    )
    drain.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9093",
        help="the broker's metrics endpoint [default: %(default)s]",
    )
    drain.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the answer [default: %(default)s]",
    )
    from kafscale.metadata import backup_cli

    backup_cli.add_parser(commands)
    commands.add_parser(
        "operator",
        help="run the Kubernetes operator (KafscaleCluster, KafscaleTopic, KafscaleUser)",
        description="Run the Kubernetes operator until stopped (docs/kubernetes.md). Settings "
        "are KAFSCALE_OPERATOR_* variables; needs the operator extra "
        "(pip install 'kafscale[operator]').",
    )
    commands.add_parser(
        "console",
        help="serve the web console (topics, messages, groups, users and ACLs)",
        description="Serve the web console until stopped (docs/console.md). Settings are "
        "KAFSCALE_CONSOLE_* and KAFSCALE_UI_* variables; there is no default login: set "
        "KAFSCALE_UI_USERNAME and KAFSCALE_UI_PASSWORD, or KAFSCALE_CONSOLE_AUTH=sasl. Needs "
        "the console extra (pip install 'kafscale[console]').",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(vars(args))
    if args.command == "flush":
        return flush(args.metrics_url)
    if args.command == "drain":
        return admin_post("drain", args.metrics_url, args.timeout)
    if args.command == "operator":
        from kafscale.operator.main import main as operator_main

        return operator_main()
    if args.command == "console":
        from kafscale.console.main import main as console_main

        return console_main()
    if args.command == "metadata":
        from kafscale.metadata import backup_cli

        return backup_cli.main(args)
    if args.command == "segments":
        from kafscale.storage import inspect, inspect_log

        if args.segments_command == "list":
            return inspect_log.main([args.topic, str(args.partition)])
        return inspect.main([args.target, *(["--records"] if args.records else [])])
    return 2


def flush(metrics_url: str) -> int:
    return admin_post("flush", metrics_url, 120.0)


def admin_post(command: str, metrics_url: str, timeout: float) -> int:
    """POST /{command} to a running broker with its admin token; 0 when it answered 200."""
    try:
        token = configuration.read_secret(
            configuration.SETTINGS_BY_FIELD["admin_token"], os.environ
        )
    except configuration.ConfigError as exc:
        print(f"kafscale {command}: {exc}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(
        metrics_url.rstrip("/") + f"/{command}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            print(response.read().decode().strip())
            return 0
    except urllib.error.HTTPError as error:
        print(error.read().decode().strip(), file=sys.stderr)
        if error.code == 401:
            print(
                f"kafscale {command}: set KAFSCALE_ADMIN_TOKEN (or KAFSCALE_ADMIN_TOKEN_FILE) to "
                "the broker's admin token",
                file=sys.stderr,
            )
    except (urllib.error.URLError, OSError) as error:
        print(f"kafscale {command}: cannot reach {metrics_url}: {error}", file=sys.stderr)
    return 1


def serve(flags: dict[str, str | None]) -> int:
    try:
        config = configuration.load(os.environ, flags)
    except configuration.ConfigError as exc:
        logs.setup("supervisor", "info")
        logging.getLogger("kafscale.config").critical("invalid configuration: %s", exc)
        print(f"kafscale: {exc}", file=sys.stderr)
        return 2
    logs.setup("supervisor", config.log_level, config.secret_values())
    log = logging.getLogger("kafscale.config")
    for name in configuration.unknown_variables(os.environ):
        log.warning("ignoring unknown configuration variable", extra={"variable": name})
    log.info("configuration", extra={"config": config.public_dict()})
    from kafscale.supervisor.serve import serve as run

    return run(config)


if __name__ == "__main__":
    sys.exit(main())
