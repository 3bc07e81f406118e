"""Number formats and autocast policies."""
