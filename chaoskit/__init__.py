"""chaoskit: chaos engineering and fault injection for LLM inference services."""

__version__ = "0.1.0"
