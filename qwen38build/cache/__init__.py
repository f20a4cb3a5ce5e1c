"""Binary caches: configuration, HTTP transport, signed records, substitution, push."""
