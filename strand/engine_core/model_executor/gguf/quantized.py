"""EngineArgs quantization="gguf": a GGUF file's linear weights kept in their blocks.

Each linear layer whose GGUF tensors are all Q8_0, Q4_0 or Q4_1 of one type is planned on the
meta model (its float weight never made nor read) and replaced by a GGUFLinear over the file's
own blocks; the other tensors are loaded dequantized as always (weights.py). What a Q4_K_M or Q5_K_M
file holds besides: Q4_K, Q5_0, Q5_1 and IQ4_NL are read as they are; Q5_K, Q6_K, Q3_K (a
Q3_K_M file's) and IQ4_XS are rewritten exactly into block types the kernels read
(strand/kernels/gguf_transcode.py: Q5_F, Q6_F, Q3_F, IQ4_F). All but Q8_0,
Q4_0 and Q4_1 are read over the CPU's 16-row tiles only, so on CUDA, without the C++ kernels or
for a row count that is not a multiple of 16 such a layer stays float. Fused layers take their
parts' rows in order (q, k, v; gate, up): a block never spans rows, so rows concatenate and
llama.cpp's q/k row permutation is undone on the packed rows as on float ones. Parts of
different types (a Q4_K_M file's Q4_K q and k and Q6_K v) each keep their own type where the
tiles read them (GGUFLinear's `more`); elsewhere all are rewritten into the one type that holds
them exactly (Q8_F, 11 bits a weight, Q8_0, or Q6_F for Q3_K with Q6_K). A tied lm_head
reads the embedding table's blocks; the embedding lookup keeps the float table. Tensors of other
types (F32, F16, BF16, Q2_K, the other IQ types) stay dequantized.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from strand.engine_core.model_executor.cpu_allocator import trim_heap
from strand.engine_core.model_executor.gguf.tensor_table import read_tensors, release
from strand.engine_core.model_executor.gguf.tensors import hf_name, unpermute
from strand.engine_core.model_executor.layers.gguf_embedding import GGUFEmbedding
from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
from strand.engine_core.model_executor.layers.linear import Linear
from strand.kernels.cpu_gguf_linear import gguf_tile
from strand.kernels.gguf_linear_ref import BLOCK, BLOCK_BYTES, NAMES, TILE_ROWS, TILES_ONLY
from strand.kernels.gguf_transcode import NATIVE, SOURCE_NAMES, common_type, transcode

logger = logging.getLogger(__name__)
# Architectures whose GGUF q/k rows llama.cpp's converter permuted (see tensors.unpermute).
_PERMUTED = ("LlamaForCausalLM", "MistralForCausalLM")


def _tiles_only_apply(device: torch.device, rows: int) -> bool:
    """Whether the types read over 16-row tiles only (Q5_0, Q5_1, Strand's) are read packed
    here: by the C++ kernels on CPU."""
    from strand.kernels._cpu_build import KERNELS

    return device.type == "cpu" and rows % TILE_ROWS == 0 and KERNELS.module() is not None


Parts = list[tuple[torch.Tensor, int]]  # (rows' blocks, packed type) in the output's order


def _runs(types: list[int], rows: list[int], device: torch.device) -> list[int] | None:
    """Each part's packed type where the parts can each keep their own (consecutive parts of
    one type are then one run): every run read over 16-row tiles here. None where the types
    differ and they cannot: then all take common_type."""
    targets = [NATIVE[t] for t in types]
    if len(set(targets)) == 1:
        return targets
    run_rows: list[int] = []
    for i, n in enumerate(rows):
        if i and targets[i] == targets[i - 1]:
            run_rows[-1] += n
        else:
            run_rows.append(n)
    return targets if all(_tiles_only_apply(device, n) for n in run_rows) else None


def _targets(tensors: list[Any], device: torch.device) -> tuple[list[int], int] | None:
    """(each part's packed type, in_features), from the tensors' types and shapes alone (no
    data read); None where the parts cannot be packed: a part missing, of a type not read
    packed, or of one read over tiles only where there are none."""
    if any(t is None for t in tensors):
        return None
    types = [int(t.tensor_type) for t in tensors]
    if any(t not in NATIVE for t in types):
        return None
    in_features = {int(t.shape[0]) for t in tensors}  # GGUF shapes are [in, out]
    if len(in_features) != 1:
        return None
    rows = [int(t.shape[1]) for t in tensors]
    targets = _runs(types, rows, device) or [common_type(types)] * len(types)
    if any(t in TILES_ONLY for t in targets) and not _tiles_only_apply(device, sum(rows)):
        return None
    return targets, next(iter(in_features))


def _read_parts(tensors: list[Any], heads: list[int | None], targets: list[int],
                device: torch.device) -> Parts:
    """Each run of parts' rows in its packed type, read from the file now; the file's pages
    then leave this process's resident set (tensor_table.release). Where the CPU kernels read
    the run in 16-row tiles it is tiled as it is read (_tiled_run), else kept in GGUF rows."""
    runs: list[tuple[int, list[tuple[Any, int | None]]]] = []
    for t, h, target in zip(tensors, heads, targets, strict=True):
        if runs and runs[-1][0] == target:  # the run goes on: its rows concatenate
            runs[-1][1].append((t, h))
        else:
            runs.append((target, [(t, h)]))
    read = []
    for target, members in runs:
        rows = [int(t.shape[1]) for t, _ in members]
        tiled = (all(n % TILE_ROWS == 0 for n in rows)
                 and _tiles_only_apply(device, sum(rows)))
        read.append((_tiled_run(members, target) if tiled
                     else _rows_run(members, target, device), target))
    return read


def _rows_run(members: list[tuple[Any, int | None]], target: int,
              device: torch.device) -> torch.Tensor:
    """A run's rows [N, row bytes] in `target` blocks, in one tensor on `device`."""
    parts = [_unpermuted(_transcoded(t, target), h) for t, h in members]
    blocks = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    # A part read as it is is still a view of the file's read-only memory map: a copy.
    if not (blocks.flags.owndata and blocks.flags.c_contiguous):
        blocks = np.array(blocks, order="C")
    for t, _ in members:
        release(t.data)
    return torch.from_numpy(blocks).to(device)


def _tiled_run(members: list[tuple[Any, int | None]], target: int) -> torch.Tensor:
    """A run's rows in `target` blocks as the CPU kernels' 16-row tiles, written a piece of rows
    at a time into the one tensor kept: each piece read from the file (its pages then let go),
    rewritten and tiled while the next is not yet read. Read whole and then tiled, a large
    table (a 128k-row vocabulary's) was in memory three times at once: the file's pages, its
    rows, its tiles."""
    in_features = int(members[0][0].shape[0])
    total = sum(int(t.shape[1]) for t, _ in members)
    tiles = torch.empty(total // TILE_ROWS, in_features // BLOCK, TILE_ROWS * BLOCK_BYTES[target],
                        dtype=torch.uint8)
    first = 0  # the part's first row in the run
    for t, h in members:
        for start, stop in _pieces(t, h):
            blocks = _unpermuted(_transcoded(t, target, start, stop), h)
            if not (blocks.flags.writeable and blocks.flags.c_contiguous):
                blocks = np.array(blocks, order="C")  # the file's own rows: a read-only map
            out = tiles[(first + start) // TILE_ROWS:(first + stop) // TILE_ROWS]
            gguf_tile(torch.from_numpy(blocks), target, in_features, out=out)
            release(t.data[start:stop])
        first += int(t.shape[1])
    return tiles


def _pieces(t: Any, heads: int | None) -> list[tuple[int, int]]:
    """The tensor's rows [start, stop) a piece at a time: whole 16-row tiles, about
    _TRANSCODE_PIECE bytes of the file's rows each; q/k rows un-permuted within their heads
    (heads is not None) in one piece."""
    n = int(t.shape[1])
    if heads is not None:
        return [(0, n)]
    row = max(1, int(t.data.nbytes) // max(1, n))
    step = max(TILE_ROWS, _TRANSCODE_PIECE // row // TILE_ROWS * TILE_ROWS)
    return [(start, min(n, start + step)) for start in range(0, n, step)]


def _unpermuted(blocks: np.ndarray, heads: int | None) -> np.ndarray:
    return unpermute(blocks, heads) if heads is not None else blocks


# Bytes of a tensor's rows transcoded at a time: the transcoding's temporaries (several bytes a
# weight, some ten times the piece) stay small beside the model, even for a 128k-row vocabulary's
# table; larger pieces were no faster.
_TRANSCODE_PIECE = 2 << 20


def _transcoded(t: Any, target: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """The tensor's rows [start, stop) ([N, row bytes]) in `target` blocks (transcode), a piece
    of rows at a time into one array; the file's rows themselves (a view) where they need no
    rewriting."""
    rows = np.asarray(t.data, dtype=np.uint8).reshape(int(t.shape[1]), -1)[start:stop]
    source = int(t.tensor_type)
    if target == source:
        return rows
    step = max(1, _TRANSCODE_PIECE // max(1, rows.shape[1]))
    first = transcode(rows[:step], source, target)
    out = np.empty((rows.shape[0], first.shape[1]), dtype=np.uint8)
    out[:step] = first
    for begin in range(step, rows.shape[0], step):
        out[begin:begin + step] = transcode(rows[begin:begin + step], source, target)
    return out


def _packed(tensors: list[Any], heads: list[int | None],
            device: torch.device) -> tuple[Parts, int] | None:
    """(each run of parts' rows and packed type, in_features), or None where the parts cannot
    be packed (_targets)."""
    found = _targets(tensors, device)
    if found is None:
        return None
    targets, in_features = found
    return _read_parts(tensors, heads, targets, device), in_features


@dataclass
class Packing:
    """One linear layer to be replaced by the file's blocks; or (embedding) the token embedding
    table, by a GGUFEmbedding over its blocks (no parts: the packed lm_head's, tied to it)."""
    parent: nn.Module
    attr: str
    # The file's tensors (read when the layer is replaced: one layer's blocks at a time in
    # memory beside the model), the heads to unpermute each by, each one's packed type.
    tensors: list[Any]
    heads: list[int | None]
    targets: list[int]
    device: torch.device
    in_features: int
    sources: list[str]  # the GGML type names of its parts, for the log
    embedding: bool = False
    head: Packing | None = None  # a tied table's: the lm_head's packing, applied before it

    def read(self) -> Parts:
        """The first run's rows and type, then any in other types."""
        return _read_parts(self.tensors, self.heads, self.targets, self.device)

    @property
    def layer(self) -> nn.Module:
        return cast(nn.Module, getattr(self.parent, self.attr))


def plan_packed(model: nn.Module, gguf_file: str, device: torch.device) -> list[Packing]:
    """The linear layers the file holds packed, read from it (the model's own weights are not
    touched: it may still be on the meta device, its float weights never made)."""
    config = cast(Any, model).config
    raw = {name: t for t in read_tensors(gguf_file)
           if (name := hf_name(t.name)) is not None}
    permute = config.architecture in _PERMUTED
    qk_heads = ([config.num_heads, config.num_kv_heads, None] if permute else [None] * 3)
    # (parent module, attribute, HF tensor names, heads to unpermute by)
    targets: list[tuple[nn.Module, str, list[str], list[int | None]]] = []
    for i, layer in enumerate(cast(Any, model).model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        targets.append((attn, "qkv_proj", [f"{p}self_attn.{n}_proj.weight" for n in "qkv"],
                        qk_heads))
        targets.append((attn, "o_proj", [f"{p}self_attn.o_proj.weight"], [None]))
        if isinstance(getattr(mlp, "gate_up_proj", None), Linear):
            targets.append((mlp, "gate_up_proj", [f"{p}mlp.gate_proj.weight",
                                                  f"{p}mlp.up_proj.weight"], [None, None]))
            targets.append((mlp, "down_proj", [f"{p}mlp.down_proj.weight"], [None]))
    if not config.labels:  # a classifier's score layer is a few float rows, not the file's head
        head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        targets.append((model, "lm_head", [head], [None]))
    plan = []
    for parent, attr, names, heads in targets:
        old = getattr(parent, attr)
        found = [raw.get(n) for n in names]
        got = _targets(found, device)
        if not isinstance(old, Linear) or got is None:
            continue
        tensors = [t for t in found if t is not None]  # all of them, or _targets said None
        types, in_features = got
        rows = sum(int(t.shape[1]) for t in tensors)
        if (rows, in_features) != tuple(old.weight.shape):
            raise ValueError(f"GGUF tensors {names} hold [{rows}, {in_features}], the "
                             f"model's {attr} is {list(old.weight.shape)}")
        plan.append(Packing(parent, attr, tensors, heads, types, device, in_features,
                            [SOURCE_NAMES[int(raw[n].tensor_type)] for n in names]))
    if not plan:
        logger.info("quantization='gguf': no linear weight of %s is of a type read packed (%s);"
                    " all stay dequantized", gguf_file, ", ".join(SOURCE_NAMES.values()))
    table = _plan_embedding(model, raw, plan, device)
    return plan + ([table] if table is not None else [])


def _plan_embedding(model: nn.Module, raw: dict[str, Any], plan: list[Packing],
                    device: torch.device) -> Packing | None:
    """The token embedding table kept in blocks (layers/gguf_embedding.py): the packed lm_head's
    where the two are tied, else the file's token_embd packed as one weight of one type; None
    where neither applies (it is then dequantized, as before)."""
    config = cast(Any, model).config
    inner = cast(Any, model).model
    if type(inner.embed_tokens) is not nn.Embedding:
        return None
    name = "model.embed_tokens.weight"
    head = next((p for p in plan if p.parent is model and p.attr == "lm_head"), None)
    if config.tie_word_embeddings and head is not None:
        if len(head.tensors) != 1:
            return None
        return Packing(inner, "embed_tokens", [], [], [], device, head.in_features,
                       head.sources, True, head)
    table = raw.get(name)
    got = None if table is None else _targets([table], device)
    if (table is None or got is None
            or (int(table.shape[1]), got[1]) != tuple(inner.embed_tokens.weight.shape)):
        return None
    return Packing(inner, "embed_tokens", [table], [None], got[0], device, got[1],
                   [SOURCE_NAMES[int(table.tensor_type)]], True)


def _apply_embedding(p: Packing) -> None:
    """The table planned by _plan_embedding in place of the float one (after the lm_head, which
    a tied table reads)."""
    old = cast(nn.Embedding, p.layer)
    if p.head is not None:
        table = cast(GGUFLinear, p.head.layer)
    else:
        (blocks, qtype), = p.read()
        table = GGUFLinear(blocks, qtype, p.in_features)
        del blocks
    setattr(p.parent, p.attr, GGUFEmbedding(table, old.weight.dtype))
    logger.info("the token embedding table stays in the file's %s blocks (%s): %.1f MB "
                "instead of %.1f MB", p.sources[0],
                "the lm_head's" if p.head is not None else "its own",
                sum(b.numel() for b, _ in table.parts()) / 1e6,
                old.weight.numel() * old.weight.element_size() / 1e6)


# Bytes of the file's rows let go between two trims of the heap (apply_packed).
_TRIM_EVERY = 64 << 20


def apply_packed(plan: list[Packing]) -> int:
    """Replaces each planned layer (its bias, if any, loaded by then) by a GGUFLinear over the
    file's blocks; returns how many were replaced."""
    kinds: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    float_bytes = packed_bytes = untrimmed = 0
    for p in plan:
        if p.embedding:
            _apply_embedding(p)
            continue
        old = cast(Linear, p.layer)
        parts = p.read()
        (first, qtype), more = parts[0], parts[1:]
        setattr(p.parent, p.attr, GGUFLinear(first, qtype, p.in_features, old.bias, more))
        kinds["+".join(NAMES[q] for _, q in parts)] += 1
        sources.update(p.sources)
        float_bytes += old.weight.numel() * old.weight.element_size()
        layer_bytes = sum(blocks.numel() for blocks, _ in parts)
        packed_bytes += layer_bytes
        # Read a layer at a time, the file's rows (regrouped into tiles by GGUFLinear on CPU)
        # are let go and their pages handed back as loading proceeds: the blocks are never
        # held twice.
        del parts, first, more
        untrimmed += layer_bytes
        if untrimmed >= _TRIM_EVERY:
            trim_heap()
            untrimmed = 0
    trim_heap()
    if kinds:
        logger.info("kept %d linear weights packed (%s; from the file's %s): %.1f MB instead "
                    "of %.1f MB", sum(kinds.values()),
                    ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())),
                    ", ".join(f"{k}: {v}" for k, v in sorted(sources.items())),
                    packed_bytes / 1e6, float_bytes / 1e6)
    return sum(kinds.values())
