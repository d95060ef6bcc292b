"""The ``kafscale`` command. ``kafscale serve`` runs a broker; every setting is a flag and a
``KAFSCALE_*`` variable (flags win), listed with ``kafscale serve --help``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import urllib.error
import urllib.request

from kafscale import config as configuration
from kafscale import logs

VERSION = "0.1.0"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafscale", description="A Kafka-protocol broker backed by S3 and etcd"
    )
    parser.add_argument("--version", action="version", version=f"kafscale {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="run a broker", description="Run a broker. Each flag overrides its variable."
    )
    for setting in configuration.SETTINGS:
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
        help="print a .kfs/.index object and verify every CRC",
        description="Print a segment's header, batches and footer (or an index's entries) and "
        "verify every CRC. The argument is a local file or, if no such file exists, an object "
        "key read through the configured object store (KAFSCALE_* variables). Exit status: 0 "
        "all verified, 1 corrupt, 2 unreadable.",
    )
    dump.add_argument("target", metavar="FILE_OR_KEY")
    flush = commands.add_parser(
        "flush",
        help="seal and commit every buffer of a running broker now",
        description="Ask a running broker to seal every partition buffer and wait until all of "
        "it is committed to S3 (POST /flush on its metrics port). Exit status 0 on success.",
    )
    flush.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9093",
        help="the broker's metrics endpoint [default: %(default)s]",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(vars(args))
    if args.command == "flush":
        return flush(args.metrics_url)
    if args.command == "segments":
        from kafscale.storage import inspect

        return inspect.main([args.target])
    return 2


def flush(metrics_url: str) -> int:
    request = urllib.request.Request(metrics_url.rstrip("/") + "/flush", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            print(response.read().decode().strip())
            return 0
    except urllib.error.HTTPError as error:
        print(error.read().decode().strip(), file=sys.stderr)
    except (urllib.error.URLError, OSError) as error:
        print(f"kafscale flush: cannot reach {metrics_url}: {error}", file=sys.stderr)
    return 1


def serve(flags: dict[str, str | None]) -> int:
    try:
        config = configuration.load(os.environ, flags)
    except configuration.ConfigError as exc:
        logs.setup("supervisor", "info")
        logging.getLogger("kafscale.config").critical("invalid configuration: %s", exc)
        print(f"kafscale: {exc}", file=sys.stderr)
        return 2
    logs.setup("supervisor", config.log_level)
    log = logging.getLogger("kafscale.config")
    for name in configuration.unknown_variables(os.environ):
        log.warning("ignoring unknown configuration variable", extra={"variable": name})
    log.info("configuration", extra={"config": config.public_dict()})
    from kafscale.supervisor.serve import serve as run

    return run(config)


if __name__ == "__main__":
    sys.exit(main())
