"""network.proxy: the L4 proxy fault, its helper process and server, and the interception the proxies share."""
