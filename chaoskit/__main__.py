"""`python -m chaoskit` runs the CLI."""

from chaoskit.cli.main import main

main()
