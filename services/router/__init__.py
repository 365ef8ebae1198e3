"""Prefix-aware request router (library): a KV block index per replica fed by KV events."""

from services.router.index import KVIndex, prompt_block_hashes
from services.router.router import ReplicaLoad, Router

__all__ = ["KVIndex", "ReplicaLoad", "Router", "prompt_block_hashes"]
