"""KV connectors: the interface (base), a CPU offload tier, MultiConnector, the factory."""
