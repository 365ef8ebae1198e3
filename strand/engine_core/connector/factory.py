"""create_connector: --kv-connector NAME with its JSON --kv-connector-config, wired to a runner.

Names: "offload" (a CPU tier of --kv-offload-bytes) and "multi" (children listed in the config:
{"connectors": [{"kv_connector": "offload", "kv_connector_config": {...}}, ...]}).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strand.engine_core.config import EngineArgs
from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.connector.cpu_tier import CPUBlockTier
from strand.engine_core.connector.multi import MultiConnector
from strand.engine_core.connector.offload import OffloadConnector

_OFFLOAD_NAMES = ("offload", "OffloadingConnector", "OffloadConnector")
_MULTI_NAMES = ("multi", "MultiConnector")
KNOWN_CONNECTORS = (*_OFFLOAD_NAMES, *_MULTI_NAMES)
_OFFLOAD_KEYS = ("kv_offload_bytes", "num_cpu_blocks")


def create_connector(args: EngineArgs, runner: Any, num_blocks: int) -> KVConnectorBase:
    """Build the connector named by args.kv_connector and attach its worker side to runner.

    runner: the ModelRunner (model_config, block_size, device, kv_caches); num_blocks: the
    device pool's size (unused by the CPU tier, kept for connectors that mirror the pool).
    """
    if not args.kv_connector:
        raise ValueError("kv_connector must name a connector, got an empty value")
    connector = _build(args.kv_connector, args.kv_connector_config or {}, args, runner)
    runner.kv_connector = connector
    return connector


def _build(name: str, config: Mapping[str, Any], args: EngineArgs,
           runner: Any) -> KVConnectorBase:
    if not isinstance(config, Mapping):
        raise ValueError(f"kv_connector_config must be a JSON object, got {config!r}")
    if name in _OFFLOAD_NAMES:
        return _build_offload(config, args, runner)
    if name in _MULTI_NAMES:
        children = config.get("connectors")
        unknown = sorted(set(config) - {"connectors"})
        if unknown:
            raise ValueError(f"kv_connector_config keys for {name!r} must be ['connectors'], "
                             f"got {unknown}")
        if not isinstance(children, list) or not children:
            raise ValueError("kv_connector_config.connectors must be a non-empty list of "
                             "{\"kv_connector\": ..., \"kv_connector_config\": {...}}")
        built = []
        for child in children:
            if not isinstance(child, Mapping) or not child.get("kv_connector"):
                raise ValueError("each kv_connector_config.connectors entry must have a "
                                 f"kv_connector name, got {child!r}")
            built.append(_build(str(child["kv_connector"]),
                                child.get("kv_connector_config") or {}, args, runner))
        return MultiConnector(built)
    raise ValueError(f"kv_connector must be one of {list(KNOWN_CONNECTORS)}, got {name!r}")


def _build_offload(config: Mapping[str, Any], args: EngineArgs,
                   runner: Any) -> OffloadConnector:
    unknown = sorted(set(config) - set(_OFFLOAD_KEYS))
    if unknown:
        raise ValueError(f"kv_connector_config keys for the offload connector must be among "
                         f"{list(_OFFLOAD_KEYS)}, got {unknown}")
    # The heads this rank's cache holds (all of them without tensor parallelism); a stand-in
    # runner without kv_config holds them all.
    model = getattr(runner, "kv_config", runner.model_config)
    block_size = int(runner.block_size)
    element = model.dtype.itemsize
    bytes_per_block = 2 * model.num_layers * block_size * model.num_kv_heads * model.head_dim * element
    if "num_cpu_blocks" in config:
        num_slots = int(config["num_cpu_blocks"])
        if num_slots < 1:
            raise ValueError(f"num_cpu_blocks must be >= 1, got {num_slots}")
    else:
        budget = int(config.get("kv_offload_bytes", args.kv_offload_bytes))
        num_slots = budget // bytes_per_block
        if num_slots < 1:
            raise ValueError(f"kv_offload_bytes must be >= one block ({bytes_per_block} bytes) "
                             f"for the offload connector, got {budget}")
    device = runner.device
    tier = CPUBlockTier(num_slots, model.num_layers, block_size, model.num_kv_heads,
                        model.head_dim, model.dtype, pin_memory=str(device).startswith("cuda"))
    attach = getattr(runner, "attach_offload_tier", None)
    if attach is not None:  # tensor parallel: every rank keeps a tier of its own heads
        attach(tier)
    return OffloadConnector(tier, block_size, lambda: runner.kv_caches)
