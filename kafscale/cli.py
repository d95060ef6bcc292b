"""The ``kafscale`` command. ``kafscale serve`` runs a broker; every setting is a flag and a
``KAFSCALE_*`` variable (flags win), listed with ``kafscale serve --help``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(vars(args))
    if args.command == "segments":
        from kafscale.storage import inspect

        return inspect.main([args.target])
    return 2


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
