"""The ``awa-fast`` console script (``[project.scripts]`` in pyproject.toml): imports
:mod:`awa_fast.cli` and runs its ``main()``.

A module of its own outside the package: importing ``awa_fast`` takes about 200 ms, and a Ctrl-C
during an import the script itself makes ends in Python's ``KeyboardInterrupt`` traceback. Here
the import runs inside :func:`main`, where an interrupt exits 130 quietly, as during a command.
"""

import sys


def main() -> int:
    """Run the ``awa-fast`` command line with ``sys.argv``.

    Returns:
        The exit status of :func:`awa_fast.cli.main`, or 130 when Ctrl-C came while it was
        being imported.
    """
    try:
        from awa_fast.cli import main as cli_main
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the ^C line, as the command does
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
