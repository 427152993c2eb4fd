"""The experiment file: typed models, loading with file/line errors, lint and JSON Schema."""
