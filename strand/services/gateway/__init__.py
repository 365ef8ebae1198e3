"""The gateway: the public strand.v1.Gateway API; owns the flow between the three stages."""
