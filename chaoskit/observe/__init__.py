"""Exporters of a run to the SRE's own observability stack (Prometheus, Pushgateway, OTLP), fed from the journal."""
