"""Reports: one view of a run built from its typed journal, rendered as summary.json, HTML, Markdown and the live view."""
