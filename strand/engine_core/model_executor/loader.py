"""Build a model from a local HF directory: config.json + single or sharded safetensors, or a
directory converted from a GGUF file, whose weights are read from the file itself."""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from strand.engine_core.distributed.layers import (
    ShardLayout,
    local_config,
    shard_layout,
    shard_model,
)
from strand.engine_core.distributed.parallel_state import TPGroup
from strand.engine_core.distributed.shard_loading import copy_shard
from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.engine_core.model_executor.model_config import ModelConfig
from strand.engine_core.model_executor.models.llama import LlamaForCausalLM
from strand.engine_core.model_executor.models.registry import model_class
from strand.engine_core.model_executor.seq_cls import score_rows

if TYPE_CHECKING:
    from strand.engine_core.model_executor.gguf.quantized import Packing

logger = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Checkpoint tensors the engine recomputes itself (old Llama checkpoints saved the RoPE table).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Weights copied a piece of rows at a time: a tensor is never held whole in the checkpoint's
# dtype beside the model's (a 7B's embedding table is 0.5 GB in float32).
_PIECE_WEIGHTS = 1 << 22


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    return torch.device(device)


def load_model(config: ModelConfig, device: torch.device, tp: TPGroup | None = None,
               max_positions: int | None = None) -> LlamaForCausalLM:
    """Weights copied straight into parameters allocated on `device` in `config.dtype`.

    With a tensor-parallel group of more than one rank: this rank's shard of the model, and only
    its part of each tensor read from the checkpoint. max_positions: the longest sequence the
    caller will run (its max_model_len); the RoPE tables stop there (None: the model's own
    max_position_embeddings)."""
    cls = model_class(config)
    layout = None
    # Built on meta first: no time spent on a random init that the checkpoint overwrites.
    if tp is not None and tp.world_size > 1:
        layout = shard_layout(config, tp.rank, tp.world_size)
        with torch.device("meta"):
            model = cls(local_config(config, layout))
            shard_model(model, layout, tp)
    else:
        with torch.device("meta"):
            model = cls(config)
    model = model.to(dtype=config.dtype)
    plan = _plan_packed(model, config, device)
    # The layers the file's blocks will replace keep their float weight on meta: it is never
    # made (a 7B model's in float32 is 28 GB), nor read from the checkpoint; only a bias is.
    planned = {id(p.layer) for p in plan}
    for module in model.modules():
        if id(module) not in planned:
            _to_empty(module, device)
        elif isinstance(bias := getattr(module, "bias", None), torch.Tensor):
            module.bias = torch.nn.Parameter(_empty(bias, device), requires_grad=False)
    model.tie_weights()
    for module in model.modules():  # Gemma 3 has two RoPE tables (global and sliding layers)
        if isinstance(module, RotaryEmbedding):
            module.build_cache(device, max_positions)
    _copy_weights(model, Path(config.model_dir), layout)
    if plan:
        from strand.engine_core.model_executor.gguf.quantized import apply_packed

        apply_packed(plan)
    return model.eval().requires_grad_(False)


def _empty(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor of a meta tensor's shape and dtype on `device`. By torch.empty,
    not empty_like: empty_like of a meta tensor runs torch's Python reference ops, whose first
    use imports sympy (some 25 MB of resident modules) in a process that never needs it."""
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def _to_empty(module: torch.nn.Module, device: torch.device) -> None:
    """module.to_empty(device=device, recurse=False), by _empty (its own parameters and
    buffers; `_apply` keeps each Parameter a Parameter, as to_empty does)."""
    module._apply(lambda t: _empty(t, device), recurse=False)


def _plan_packed(model: LlamaForCausalLM, config: ModelConfig,
                 device: torch.device) -> list[Packing]:
    """quantization='gguf': the linear layers the GGUF file's blocks replace
    (strand/engine_core/model_executor/gguf/quantized.py); none otherwise."""
    if config.quantization != "gguf":
        return []
    from strand.engine_core.model_executor.gguf.quantized import plan_packed

    if config.gguf_file is None:
        raise ValueError("quantization='gguf' needs the GGUF file the model was loaded from")
    return plan_packed(model, config.gguf_file, device)


def checkpoint_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it: a safetensors file (from the index file when the
    checkpoint is sharded), or the .gguf file a converted directory was made from."""
    from strand.engine_core.model_executor.gguf.convert import weights_file

    source = weights_file(model_dir)
    if source is not None:
        with _open_weights(source, model_dir) as f:
            return dict.fromkeys(f.keys(), source)
    index = model_dir / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' object")
        files = {name: model_dir / fname for name, fname in weight_map.items()}
        missing = sorted({str(p) for p in files.values() if not p.is_file()})
        if missing:
            raise FileNotFoundError(f"{index} names shard files that do not exist: {missing}")
        return files
    paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(
            f"model directory {str(model_dir)!r} has no {SINGLE_FILE} (or {SAFETENSORS_INDEX})")
    files = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                files[name] = path
    return files


def _open_weights(path: Path, model_dir: Path) -> AbstractContextManager[Any]:
    """safe_open over a safetensors file; a GGUF file read through the same interface."""
    if path.suffix.lower() != ".gguf":
        return safe_open(str(path), framework="pt")
    from strand.engine_core.model_executor.gguf.weights import GGUFWeights

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return GGUFWeights(path, config)


def _copy_rows(part: Any, dest: torch.Tensor) -> None:
    """dest (the whole tensor) from a checkpoint slice, a piece of rows at a time."""
    if dest.dim() < 2:
        dest.copy_(part[:])
        return
    step = max(1, _PIECE_WEIGHTS // max(1, dest[0].numel()))
    for start in range(0, dest.shape[0], step):
        stop = min(dest.shape[0], start + step)
        # copy_ converts the dtype and crosses devices in one go.
        dest[start:stop].copy_(part[start:stop])


def _copy_weights(model: LlamaForCausalLM, model_dir: Path,
                  layout: ShardLayout | None = None) -> None:
    destinations = model.weight_destinations()
    files = checkpoint_files(model_dir)
    from_tokens = bool(model.config.score_token_ids)
    if from_tokens:  # the score layer is made of the LM head's rows (_copy_score_rows)
        score = destinations.pop("score.weight")
    missing = [name for name in destinations if name not in files]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5
                                          else "")
        raise ValueError(f"checkpoint in {str(model_dir)!r} is missing tensor(s): {shown}")
    unexpected = [n for n in files if n not in destinations and not n.endswith(_IGNORED_SUFFIXES)
                  and not (n == "lm_head.weight" and (model.config.tie_word_embeddings
                                                      or from_tokens))]
    if unexpected:
        logger.warning("ignoring %d checkpoint tensor(s) the model does not use: %s",
                       len(unexpected), ", ".join(unexpected[:5]))
    by_file: dict[Path, list[str]] = {}
    for name in destinations:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with _open_weights(path, model_dir) as f:
            for name in names:
                dest = destinations[name]
                if dest.is_meta:  # a layer whose packed blocks replace it (_plan_packed)
                    continue
                if layout is not None:
                    copy_shard(f, name, dest, layout, path.name)
                    continue
                part = f.get_slice(name)
                shape = tuple(part.get_shape())
                if shape != tuple(dest.shape):
                    raise ValueError(
                        f"tensor {name!r} in {path.name} has shape {list(shape)}, the model "
                        f"expects {list(dest.shape)}")
                _copy_rows(part, dest)
    if from_tokens:
        _copy_score_rows(model.config, files, model_dir, score)


def _copy_score_rows(config: ModelConfig, files: dict[str, Path], model_dir: Path,
                     score: torch.Tensor) -> None:
    """classifier_from_token: the score layer from the LM head's rows of its tokens (the
    embedding table's, for a tied head), whole on every rank."""
    name = "lm_head.weight" if "lm_head.weight" in files else "model.embed_tokens.weight"
    with _open_weights(files[name], model_dir) as f:
        part = f.get_slice(name)
        rows = torch.stack([torch.as_tensor(part[i:i + 1])[0] for i in config.score_token_ids])
    assert config.score_method is not None
    score.copy_(score_rows(rows, config.score_method))
