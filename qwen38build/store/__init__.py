"""The content-addressed store: entries, sessions and temporary roots, build records, gc, check."""
