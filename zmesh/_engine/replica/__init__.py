"""Replicated outboxes: copies of producers ' outboxes, take-overs and hand-backs."""
