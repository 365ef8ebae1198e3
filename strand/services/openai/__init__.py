"""An OpenAI-compatible HTTP front (FastAPI on uvicorn) that talks to the gateway over gRPC."""
