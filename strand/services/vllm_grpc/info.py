"""HealthCheck, GetModelInfo, GetServerInfo and GetTokenizer's bundle: what the stack is, from
the gateway's GetServerInfo and the model directory's config files."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

from smg_grpc_proto.generated import common_pb2 as cmn
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services.vllm_grpc.link import GatewayLink

SERVER_TYPE = "strand-vllm-grpc"  # what GetServerInfo answers; vLLM's own says "vllm-grpc"
CHUNK_BYTES = 64 * 1024  # one GetTokenizerChunk, as smg's reader expects
# The files a tokenizer needs (smg builds its tokenizer from these), and the model's config.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "generation_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "tiktoken.model", "chat_template.json")
TOKENIZER_GLOBS = ("*.jinja", "*.tiktoken")
_STARTED = time.time()
_bundles: dict[Path, list[cmn.GetTokenizerChunk]] = {}


async def health_check(link: GatewayLink) -> vpb.HealthCheckResponse:
    """Healthy while the gateway answers (and, through it, the stages)."""
    try:
        await link.client.get_server_info()
    except Exception as exc:  # noqa: BLE001 - any failure is an unhealthy answer, not an error
        return vpb.HealthCheckResponse(healthy=False, message=f"gateway not answering: {exc}")
    return vpb.HealthCheckResponse(healthy=True, message="Healthy")


async def model_info(link: GatewayLink) -> vpb.GetModelInfoResponse:
    server = await link.client.get_server_info()
    config = _read_json(link.config.model_dir, "config.json")
    generation = _read_json(link.config.model_dir, "generation_config.json")
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    model_dir = str(link.config.model_dir or server["model"])
    max_len = int(server["max_model_len"])
    return vpb.GetModelInfoResponse(
        model_path=model_dir, tokenizer_path=model_dir, is_generation=not server["labels"],
        max_context_length=max_len, max_req_input_len=max_len,
        vocab_size=int(server["vocab_size"]), supports_vision=False,
        served_model_name=link.config.served_model_name or str(server["model"]),
        model_type=str(config.get("model_type", "")),
        architectures=[str(a) for a in config.get("architectures", [])],
        eos_token_ids=[int(e) for e in eos_ids],
        pad_token_id=_int_or(config.get("pad_token_id"), -1),
        bos_token_id=_int_or(generation.get("bos_token_id", config.get("bos_token_id")), -1),
        default_sampling_params_json=json.dumps(_sampling_defaults(generation)))


async def server_info(link: GatewayLink) -> vpb.GetServerInfoResponse:
    server = await link.client.get_server_info()
    loads = (await link.control_call("GetLoads", cpb.GetLoadsRequest())).loads
    return vpb.GetServerInfoResponse(
        active_requests=sum(int(x.num_running + x.num_waiting) for x in loads),
        is_paused=False, uptime_seconds=time.time() - _STARTED, server_type=SERVER_TYPE,
        data_parallel_size=1, kv_cache_dtype=str(server["kv_cache_dtype"]),
        block_size=int(server["block_size"]), model_dtype=str(server["dtype"]))


async def tokenizer_chunks(model_dir: Path | None) -> list[cmn.GetTokenizerChunk]:
    """The tokenizer bundle as GetTokenizer streams it: a zip in CHUNK_BYTES pieces, the last
    carrying the sha256 of the whole zip. Built once per directory, off the event loop."""
    if model_dir is None:
        raise FileNotFoundError("no model directory")
    if model_dir not in _bundles:
        _bundles[model_dir] = await asyncio.to_thread(_build_chunks, model_dir)
    return _bundles[model_dir]


def _build_chunks(model_dir: Path) -> list[cmn.GetTokenizerChunk]:
    data = tokenizer_zip(model_dir)
    digest = hashlib.sha256(data).hexdigest()
    starts = range(0, len(data), CHUNK_BYTES)
    return [cmn.GetTokenizerChunk(data=data[s:s + CHUNK_BYTES],
                                  sha256=digest if s + CHUNK_BYTES >= len(data) else "")
            for s in starts]


def tokenizer_zip(model_dir: Path) -> bytes:
    names = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    names += sorted({p.name for g in TOKENIZER_GLOBS for p in model_dir.glob(g)
                     if p.is_file()} - set(names))
    if not names:
        raise FileNotFoundError(f"no tokenizer files in {model_dir}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in names:
            zf.write(model_dir / name, name)
    return buf.getvalue()


def _read_json(model_dir: Path | None, name: str) -> dict[str, Any]:
    if model_dir is None or not (model_dir / name).is_file():
        return {}
    value = json.loads((model_dir / name).read_text())
    return value if isinstance(value, dict) else {}


def _int_or(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) else default


def _sampling_defaults(generation: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json's sampling fields, as vLLM's servicer reports them."""
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    return {k: generation[k] for k in keys if k in generation}
