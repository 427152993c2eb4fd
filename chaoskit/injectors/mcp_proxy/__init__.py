"""mcp.proxy: the MCP (streamable HTTP) proxy fault, its server and its fault table."""
