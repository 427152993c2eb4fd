"""kv.notify: the KV-transfer notification fault and its side-channel proxy server."""
