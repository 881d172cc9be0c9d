"""``python -m awa_fast``: the awa-fast command line (see :mod:`awa_fast.cli`).

Python imports the ``awa_fast`` package before this module runs: a Ctrl-C during that import
still ends in its traceback (the ``awa-fast`` script, ``_awa_fast_cli.py``, imports it itself).
A Ctrl-C during the import of :mod:`awa_fast.cli` exits 130 quietly, as the script does.
"""

import sys

if __name__ == "__main__":
    try:
        from awa_fast.cli import main
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
