"""The engine: steps and their digests, the plan, realising steps, the no-op fast path, progress."""
