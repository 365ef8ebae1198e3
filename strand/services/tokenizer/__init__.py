"""The tokenizer stage: InputProcessor behind a gRPC stream."""
