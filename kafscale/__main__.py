import sys

from kafscale.cli import main

sys.exit(main())
