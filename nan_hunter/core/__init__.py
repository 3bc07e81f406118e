"""Small values and helpers that any folder may use: source locations, batches, the
range map's data, the safe file writer, progress notes, the torch-free spike rule.

May import: only ``nan_hunter.errors``, ``nan_hunter.version`` and the rest of this folder. Keep it
torch-free at import where a module was before (the command line's process imports
``core/range_map.py``, ``core/progress.py``, ``core/spikes.py``)."""
