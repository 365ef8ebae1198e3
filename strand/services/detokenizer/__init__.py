"""The detokenizer stage: OutputProcessor behind a gRPC stream."""
