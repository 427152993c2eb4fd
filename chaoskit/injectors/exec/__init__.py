"""exec: the user's own fault as commands (apply, revert, observe)."""
