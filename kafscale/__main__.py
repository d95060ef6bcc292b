"""``python -m kafscale`` and the ``kafscale`` command: ``kafscale.cli`` in a process of its
own (``kafscale.runtime.without_hypothesis`` first)."""

import sys

from kafscale.runtime import without_hypothesis


def main() -> int:
    without_hypothesis()
    from kafscale.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
