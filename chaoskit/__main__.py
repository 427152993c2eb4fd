"""`python -m chaoskit` runs the CLI."""

from chaoskit.cli import main

main()
