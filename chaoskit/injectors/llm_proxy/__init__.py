"""llm.proxy: the HTTP reverse-proxy fault, its server, its fault table, SSE framing and spans."""
