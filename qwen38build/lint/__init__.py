"""The ledger's rules as code."""
