"""LMDB persistence of a node: outbox, lanes, dedupe window, dead letters."""
