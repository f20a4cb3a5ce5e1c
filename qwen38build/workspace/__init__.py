"""The topic workspace: the series as git commits, and export back to patch files."""
