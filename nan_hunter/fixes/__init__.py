"""Fixes: source edits, as unified diffs, that make an FP16 mixed-precision culprit safe.

Each fix module reads the user's file, plans a minimal textual edit (keeping comments and
formatting elsewhere), checks that the patched file still compiles, and returns the edit as a
unified diff with ``a/`` and ``b/`` paths that ``git apply`` and ``patch -p1`` accept.
``autocast_region`` wraps a culprit statement in an autocast-disabled region and upcasts the
culprit op's operands to FP32.
"""
