"""qwen38build: a declarative, locked, content-addressed build of a patched vLLM stack."""

__version__ = "0.1.0"
