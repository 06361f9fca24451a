"""zmesh wire format: frames and their pure codec."""
