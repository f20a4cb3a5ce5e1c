"""Wheels: the raw-copy writer, installed-tree verify and apply, the stack's environment."""
