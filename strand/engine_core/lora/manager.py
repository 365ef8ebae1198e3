"""LoRAManager (the worker side): adapters loaded on the host (an LRU of max_cpu_loras, pinned
ones kept), max_loras device slots, and each step's token -> slot groups.

vLLM's split: add_lora / remove_lora / pin_lora / list_loras act on the loaded adapters; a step
copies the adapters its requests use into slots (least recently used slot out) and tells every
adapted layer which tokens take which slot.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import nn

from strand.engine_core.config import LoRAConfig
from strand.engine_core.lora.layers import LoRABatch, LoRALayerSlots
from strand.engine_core.lora.peft_adapter import TARGET_MODULES, LoRAAdapter, load_peft_adapter
from strand.engine_core.lora.punica import make_segments
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.lora.sharding import LoRAShard
from strand.engine_core.model_executor.models.llama import LlamaMLP

if TYPE_CHECKING:
    from strand.engine_core.model_executor.models.llama import LlamaDecoderLayer

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(self, model: nn.Module, config: LoRAConfig, device: torch.device,
                 dtype: torch.dtype, shard: LoRAShard | None = None) -> None:
        """shard: this tensor-parallel rank's part of the model (None: the whole model); the
        manager then keeps this rank's slices of each adapter (lora/sharding.py)."""
        self.model = model
        self.config = config
        self.device = device
        self.dtype = dtype
        self.shard = shard
        self.batch = LoRABatch()
        # (layer index, fused Linear path) -> its slots; shapes: HF module -> (in, out) in the
        # full model (what a PEFT adapter is checked against).
        self.layers: dict[tuple[int, str], LoRALayerSlots] = {}
        self.shapes: dict[str, tuple[int, int]] = {}
        self._attach(config.max_loras, config.max_lora_rank)
        if shard is not None:
            self.shapes = shard.full_shapes(self.shapes)
        # Rank 0 of a tensor-parallel engine sets it: repeats a successful add / remove / pin
        # on the worker ranks (method name, args), so every rank's manager holds the same
        # adapters; ValueError naming the ranks that failed. A step needs no mirror: every rank
        # gets the same SchedulerOutput and makes the same (re)loads and slot choices.
        self.mirror: Callable[[str, tuple[object, ...]], None] | None = None
        # With a mirror: adapters add_lora found loaded (each request with an adapter adds it),
        # moved up the LRU here but not yet on the workers. A collective per request would cost
        # milliseconds; the workers repeat them before the next mirrored call or step instead,
        # so every rank's LRU order, hence its choice of what to unload, stays the same. Only
        # each id's last touch matters, so it holds at most one entry per loaded adapter.
        self.touched: OrderedDict[int, None] = OrderedDict()
        self.loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()  # LRU first
        self.pinned: set[int] = set()
        self.slot_ids: list[int | None] = [None] * config.max_loras  # slot -> adapter id
        self.slot_order: list[int] = list(range(config.max_loras))  # LRU slot first

    def _attach(self, max_loras: int, max_rank: int) -> None:
        decoder = getattr(self.model, "model", None)
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"enable_lora: {type(self.model).__name__} has no decoder layers "
                             "to adapt")
        self.num_layers = len(layers)
        for i, block in enumerate(layers):
            layer = cast("LlamaDecoderLayer", block)
            attn = layer.self_attn
            slices = {"self_attn.qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size],
                      "self_attn.o_proj": [attn.o_proj.out_features]}
            if isinstance(layer.mlp, LlamaMLP):  # MoE layers have experts instead: not adapted
                slices["mlp.gate_up_proj"] = [layer.mlp.intermediate_size] * 2
                slices["mlp.down_proj"] = [layer.mlp.down_proj.out_features]
            for path, sizes in slices.items():
                linear = cast(nn.Linear, layer.get_submodule(path))
                self.layers[(i, path)] = LoRALayerSlots(linear, sizes, self.batch, max_loras,
                                                        max_rank, self.device, self.dtype)
        for module, (path, index) in TARGET_MODULES.items():
            target = self.layers.get((0, path))
            if target is not None:
                self.shapes[module] = (target.in_features, target.slice_sizes[index])

    # ---- loaded adapters (vLLM's add_lora / remove_lora / pin_lora / list_loras) --------------

    def add_lora(self, request: LoRARequest) -> bool:
        """Load the adapter (or mark it recently used); ValueError for one that cannot apply."""
        if not isinstance(request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if request.lora_int_id in self.loaded:
            self.loaded.move_to_end(request.lora_int_id)
            if self.mirror is not None:
                self.touched[request.lora_int_id] = None
                self.touched.move_to_end(request.lora_int_id)
            return True
        if len(self.loaded) >= self.config.max_cpu_loras and not self._evictable(set()):
            raise ValueError(f"max_cpu_loras ({self.config.max_cpu_loras}) adapters are loaded "
                             "and all pinned: remove_lora one first")
        self._load(request, keep=set())
        try:
            self._mirror("add_lora", request)
        except ValueError:
            self.remove_lora(request.lora_int_id)  # on every rank: none keeps a half-added one
            raise
        return True

    def _mirror(self, method: str, *args: object) -> None:
        if self.mirror is not None:
            self.mirror(method, args)

    def take_touched(self) -> list[int]:
        """The LoRA ids to touch on the workers before the call or step now sent them."""
        touched = list(self.touched)
        self.touched.clear()
        return touched

    def touch(self, lora_ids: Sequence[int]) -> None:
        """A worker rank: rank 0's add_lora of adapters it had loaded (LRU order only)."""
        for lora_id in lora_ids:
            if lora_id in self.loaded:
                self.loaded.move_to_end(lora_id)

    def _load(self, request: LoRARequest, keep: set[int]) -> None:
        """Read the adapter and make room for it, never unloading one in `keep` (the step's
        own adapters: their slots are already filled). With nothing else to unload (pinned
        adapters fill max_cpu_loras) the step's adapter is loaded past the bound anyway: a
        step never fails for want of room."""
        adapter = load_peft_adapter(request.lora_path, request.lora_int_id, request.lora_name,
                                    self.config.max_lora_rank, self.shapes, self.num_layers,
                                    self.dtype)
        for layer, module in adapter.weights:
            if (layer, TARGET_MODULES[module][0]) not in self.layers:
                raise ValueError(f"layer {layer} has no {module} to adapt (a MoE layer)")
        if self.shard is not None:
            adapter = self.shard.shard(adapter)
        while len(self.loaded) >= self.config.max_cpu_loras and self._evictable(keep):
            self._unload(self._evictable(keep)[0])
        self.loaded[request.lora_int_id] = adapter
        logger.info("loaded LoRA adapter %r (id %d, rank %d, %d modules) from %s",
                    request.lora_name, request.lora_int_id, adapter.rank, len(adapter.weights),
                    request.lora_path)

    def remove_lora(self, lora_id: int) -> bool:
        if lora_id not in self.loaded:
            return False
        self._unload(lora_id)
        self._mirror("remove_lora", lora_id)
        return True

    def pin_lora(self, lora_id: int) -> bool:
        """Keep the adapter loaded however many others are added."""
        if lora_id not in self.loaded:
            raise ValueError(f"lora_id {lora_id} is not loaded (add_lora it first); loaded: "
                             f"{sorted(self.loaded)}")
        self.pinned.add(lora_id)
        self._mirror("pin_lora", lora_id)
        return True

    def list_loras(self) -> set[int]:
        return set(self.loaded)

    def _evictable(self, keep: set[int]) -> list[int]:
        """Unpinned loaded adapters outside keep, least recently used first."""
        return [i for i in self.loaded if i not in self.pinned and i not in keep]

    def _unload(self, lora_id: int) -> None:
        del self.loaded[lora_id]
        self.pinned.discard(lora_id)
        if lora_id in self.slot_ids:
            slot = self.slot_ids.index(lora_id)
            self.slot_ids[slot] = None
            for target in self.layers.values():
                target.clear(slot)

    # ---- one step ------------------------------------------------------------------------

    def set_batch(self, lora_requests: Sequence[LoRARequest | None],
                  req_of_token: np.ndarray) -> bool:
        """Slots for the step's adapters and its adapted tokens sorted by slot; True when any
        token has an adapter. lora_requests: one per request of the step, req_of_token
        [num_tokens]."""
        req_slots = np.full(len(lora_requests), -1, dtype=np.int64)
        in_step = {r.lora_int_id for r in lora_requests if r is not None}
        if len(in_step) > len(self.slot_ids):
            raise RuntimeError(f"a step holds {len(in_step)} adapters, more than max_loras "
                               f"({len(self.slot_ids)}): the scheduler must cap them")
        for i, request in enumerate(lora_requests):
            if request is not None:
                req_slots[i] = self._slot_for(request, in_step)
        token_slots = torch.from_numpy(req_slots[req_of_token])
        self.batch.segments = make_segments(token_slots, self.device) if in_step else None
        self.batch.token_slots = token_slots.to(self.device) if in_step else None
        return bool(in_step)

    def _slot_for(self, request: LoRARequest, in_step: set[int]) -> int:
        lora_id = request.lora_int_id
        if lora_id in self.slot_ids:
            slot = self.slot_ids.index(lora_id)
        else:
            if lora_id not in self.loaded:
                # Unloaded since it was added (LRU or remove_lora): its directory is read again.
                self._load(request, keep=in_step)
            slot = next(s for s in self.slot_order
                        if self.slot_ids[s] is None or self.slot_ids[s] not in in_step)
            self._fill(slot, self.loaded[lora_id])
        self.loaded.move_to_end(lora_id)
        self.slot_order.remove(slot)
        self.slot_order.append(slot)
        return slot

    def _fill(self, slot: int, adapter: LoRAAdapter) -> None:
        for target in self.layers.values():
            target.clear(slot)
        for (layer, module), (a, b) in adapter.weights.items():
            path, index = TARGET_MODULES[module]
            self.layers[(layer, path)].set(slot, index, a.to(self.device), b.to(self.device))
        self.slot_ids[slot] = adapter.lora_int_id


MIRRORED = ("add_lora", "remove_lora", "pin_lora")


def apply_mirrored(runner: object, touched: list[int], method: str,
                   args: tuple[object, ...]) -> object:
    """A worker rank's side of LoRAManager.mirror (sent as a collective_rpc callable): rank 0's
    touches since the last command, then its call."""
    manager = getattr(runner, "lora_manager", None)
    if not isinstance(manager, LoRAManager):
        raise ValueError("this rank has no LoRA manager: enable_lora must be set on every rank")
    if method not in MIRRORED:
        raise ValueError(f"method must be one of {MIRRORED}, got {method!r}")
    manager.touch(touched)
    return getattr(manager, method)(*args)
