"""The validated boundary: models of every file that comes in (recipe, lock)."""
