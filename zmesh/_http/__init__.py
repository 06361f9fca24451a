"""A node's HTTP API (``NodeConfig.http_address``): its state, the mesh's, dead letters and
Prometheus metrics, served from the standard library on a thread of the node's own."""
