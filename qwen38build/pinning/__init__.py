"""Making the locks: the sources pinned by fetching them, the Python environment by uv."""
