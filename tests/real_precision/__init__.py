"""Real code with public precision bugs, for ``tests/test_real_precision.py``: transformers'
modules put back to their pre-fix forms, and published layers (naive variance, causal linear
attention) written as their papers and repositories have them. Each culprit line ends with a
``# <- ...`` marker the tests find it by."""
