"""From a loaded target to a ``Report``: the passes (``runner``, ``traced_forward``,
``pass_retry``, ``pass_state``), what they found (``analysis``, ``candidate``, ``blame``,
``precision_loss``), the range map built from a pass (``range_map``), and ``scan`` that runs them
and the rules and fixes.

May import: ``core/``, ``project/``, ``precision/``, ``trace/``, ``rules/``, ``fixes/``, the root's
data types. Prints nothing."""
