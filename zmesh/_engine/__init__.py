"""The node's IO thread and its delivery state."""
