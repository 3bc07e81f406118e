"""``python -m nan_hunter``: the same command line as ``nan-hunter``."""

from nan_hunter.cli import main

if __name__ == "__main__":
    main()
