"""Fault tests across hosts made of network namespaces (root only)."""
