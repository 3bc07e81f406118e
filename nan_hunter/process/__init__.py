"""The scan process and the processes a model or script starts: running a job in a
child interpreter (``isolation``, ``worker``), what the scan process runs (``scan_process``), what
a ``run`` script's process runs (``script_process``), limits and clean-up of their descendants.

May import: everything below the command line (``core/``, ``project/``, ``engine/``, ``report/``,
``fixes/``, ``training/``, ``api``); not ``cli/``."""
