"""vLLM's gRPC engine protocol (vllm.grpc.engine.VllmEngine) in front of a Strand gateway."""
