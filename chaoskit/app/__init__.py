"""The application layer: run one experiment or a suite, replay orphans; the CLI parses and renders around it."""
