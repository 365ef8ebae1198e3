"""Prefix-aware request router (library): a KV block index per replica fed by KV events."""

from strand.services.router.index import KVIndex, prompt_block_hashes
from strand.services.router.router import ReplicaLoad, Router

__all__ = ["KVIndex", "ReplicaLoad", "Router", "prompt_block_hashes"]
