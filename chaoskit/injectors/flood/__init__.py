"""load.flood: open-loop load as a fault, run by its helper process."""
