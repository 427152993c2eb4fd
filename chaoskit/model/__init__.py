"""The typed vocabulary every layer shares: field types, tolerances and rules (imports only errors and units)."""
