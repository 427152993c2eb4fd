"""The command line (typer): parse arguments, call chaoskit.app, render; `main` is the `chaoskit` entry point."""

from chaoskit.cli.main import app, main

__all__ = ["app", "main"]
