"""``python -m awa_fast``: the awa-fast command line (see :mod:`awa_fast.cli`)."""

import sys

from awa_fast.cli import main

if __name__ == "__main__":
    sys.exit(main())
