"""The engine stage: EngineCore behind a gRPC stream."""
