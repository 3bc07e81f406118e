"""The user's side: loading the model file, discovering files and settings, the targets,
suppressions, the package's data files, the allowed option names and their one normaliser.

May import: ``core/``, the root's data types (``errors``, ``findings``), ``precision/``, ``trace/``
(the loader only). This package's ``__init__`` imports nothing: the command line's process must
not import torch."""
