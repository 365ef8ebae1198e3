"""ModelConfig: what the engine needs from a local HF directory's config.json, validated."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strand.engine_core.model_executor.arch_config import (
    ArchOptions,
    longrope_scaling,
    parse_arch_options,
)
from strand.engine_core.model_executor.seq_cls import (
    activation_of,
    causal_name,
    labels_of,
    score_config,
    score_fields,
)

# HF architecture name -> the family the loader builds (all Llama-shaped decoders).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Phi3ForCausalLM",
                           "Gemma2ForCausalLM", "Gemma3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")

if TYPE_CHECKING:
    import torch

# Accepted names -> torch's. torch is imported only to resolve one: the tokenizer and
# detokenizer stages read this file for the model's limits (model_limits) and would otherwise
# load torch (about 200 MB of RSS each) for nothing.
_DTYPES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
}


@dataclass(slots=True)
class ModelConfig:
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    # {"rope_type": "linear" | "llama3", "factor": ..., ...}; None: plain RoPE.
    rope_scaling: dict[str, Any] | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 always; Llama with attention_bias
    o_proj_bias: bool  # Llama with attention_bias
    dtype: torch.dtype  # resolved: the weights and activations are kept in this dtype
    eos_token_id: int | list[int] | None
    bos_token_id: int | None
    model_dir: str
    # Fields of the families past Llama (arch_config.py); the defaults are Llama's.
    arch: ArchOptions = field(default_factory=ArchOptions)
    # EngineArgs.quantization: "gguf" keeps gguf_file's linear weights packed (gguf/quantized.py).
    quantization: str | None = None
    gguf_file: str | None = None  # the .gguf model_dir was converted from (with quantization)
    # A *ForSequenceClassification checkpoint (seq_cls.py): its labels in id order, and the
    # "LM head" is its `score` layer (hidden -> len(labels)). Empty: a causal LM.
    labels: tuple[str, ...] = ()
    # A classifier's output function (seq_cls.activation_of): sigmoid, softmax or identity.
    activation: str = "softmax"
    # Trained for matryoshka embeddings (config.json's is_matryoshka, or the widths it lists in
    # matryoshka_dimensions): PoolingParams.dimensions may shorten its vectors.
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    # vLLM's classifier_from_token: a causal checkpoint's score layer made of its LM head's rows
    # for these tokens, as `score_method` says (seq_cls.py); empty: the checkpoint's own.
    score_tokens: tuple[str, ...] = ()
    score_method: str | None = None
    score_token_ids: tuple[int, ...] = ()  # the tokens' ids, set by the engine's tokenizer

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def head_size(self) -> int:
        """The head's outputs: the vocabulary, or a classifier's labels."""
        return self.num_labels or self.vocab_size

    @property
    def first_eos_token_id(self) -> int | None:
        return _first_eos(self.eos_token_id)


def load_model_config(model_dir: str, dtype: str = "auto",
                      overrides: dict[str, Any] | None = None) -> ModelConfig:
    """Read `model_dir/config.json` (with vLLM's hf_overrides fields replaced);
    FileNotFoundError or ValueError naming what is wrong."""
    raw = {**_read_config(model_dir), **(overrides or {})}
    return model_config_from_dict(raw, str(Path(model_dir)), dtype)


def model_limits(model_dir: str, overrides: dict[str, Any] | None = None) -> tuple[int, int]:
    """(max_position_embeddings, vocab_size) from config.json, for the stages that need only
    these; an unsupported architecture is the same one-line error as load_model_config's."""
    raw = {**_read_config(model_dir), **(overrides or {})}
    _architecture(raw)
    return int(raw.get("max_position_embeddings", 2048)), _positive_int(raw, "vocab_size")


def config_eos_token_id(model_dir: str) -> int | None:
    """config.json's EOS (the first, where it lists several): what a stage without a tokenizer
    (skip_tokenizer_init) stops on, as ModelConfig.first_eos_token_id."""
    return _first_eos(_read_config(model_dir).get("eos_token_id"))


def _first_eos(eos: object) -> int | None:
    """config.json's eos_token_id: an id, a list of them (the first), or absent."""
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) and not isinstance(eos, bool) else None


def _read_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{config_path} must hold a JSON object")
    return raw


def model_config_from_dict(raw: dict[str, Any], model_dir: str, dtype: str = "auto") -> ModelConfig:
    architecture = _architecture(raw)
    labels = labels_of(score_config(raw)) if _is_classifier(raw) else ()
    hidden = _positive_int(raw, "hidden_size")
    num_heads = _positive_int(raw, "num_attention_heads")
    num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_key_value_heads must divide num_attention_heads ({num_heads}), got {num_kv_heads}")
    head_dim = int(raw.get("head_dim") or hidden // num_heads)
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    if raw.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported (Llama, Mistral and Qwen2 have no MLP bias)")
    num_layers = _positive_int(raw, "num_hidden_layers")
    arch = parse_arch_options(raw, architecture, num_layers)
    rope_theta, rope_scaling = _rope(raw)
    attention_bias = bool(raw.get("attention_bias", False))
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    return ModelConfig(
        architecture=architecture,
        hidden_size=hidden,
        intermediate_size=_positive_int(raw, "intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab_size=_positive_int(raw, "vocab_size"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        # A classifier's score layer is its own (its configs often inherit the base's tie).
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)) and not labels,
        qkv_bias=is_qwen2 or attention_bias,
        o_proj_bias=attention_bias and not is_qwen2,
        dtype=resolve_dtype(dtype, raw.get("torch_dtype") or raw.get("dtype")),
        eos_token_id=raw.get("eos_token_id"),
        bos_token_id=raw.get("bos_token_id"),
        model_dir=model_dir,
        arch=arch,
        labels=labels,
        activation=activation_of(raw, len(labels)),
        is_matryoshka=bool(raw.get("is_matryoshka")) or bool(_matryoshka_dimensions(raw)),
        matryoshka_dimensions=_matryoshka_dimensions(raw),
        **score_fields(raw, labels),
    )


def resolve_dtype(requested: str, config_dtype: str | None) -> torch.dtype:
    """auto: the checkpoint's dtype (float32 when the config names none)."""
    import torch

    if requested == "auto":
        name = config_dtype or "float32"
        if name not in _DTYPES:
            raise ValueError(
                f"config.json torch_dtype must be float32, bfloat16 or float16, got {name!r}")
        return getattr(torch, _DTYPES[name])  # type: ignore[no-any-return]
    if requested not in _DTYPES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {requested!r}")
    return getattr(torch, _DTYPES[requested])  # type: ignore[no-any-return]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32": the name the flags take."""
    return str(dtype).removeprefix("torch.")


def _architecture(raw: dict[str, Any]) -> str:
    """The family the loader builds: a supported causal LM, or the causal LM a supported
    *ForSequenceClassification is built on."""
    return _match(raw)[0]


def _is_classifier(raw: dict[str, Any]) -> bool:
    """The architecture _architecture chose is a sequence classifier."""
    family, named = _match(raw)
    return family != named


def _match(raw: dict[str, Any]) -> tuple[str, str]:
    """(the family, the name config.json gives it) of the first supported architecture."""
    archs = raw.get("architectures") or []
    for arch in archs:
        family = causal_name(str(arch)) or str(arch)
        if family in SUPPORTED_ARCHITECTURES:
            return family, str(arch)
    raise ValueError(
        f"unsupported architecture {archs!r} in config.json 'architectures'; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} (and each one's ForSequenceClassification)")


def _matryoshka_dimensions(raw: dict[str, Any]) -> tuple[int, ...]:
    widths = raw.get("matryoshka_dimensions") or []
    if not isinstance(widths, list) or not all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
        raise ValueError(f"matryoshka_dimensions must be a list of integers >= 1, got {widths!r}")
    return tuple(widths)



def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers 5 writes `rope_parameters` (theta inside); older configs `rope_theta` +
    # `rope_scaling`. Both describe the same thing.
    params = dict(raw.get("rope_parameters") or {})
    if isinstance(params.get("full_attention"), dict):
        # Gemma 3 (transformers 5): one entry per layer type; the sliding layers' base is read
        # by arch_config (local_rope_theta).
        params = dict(params["full_attention"])
    scaling = dict(raw.get("rope_scaling") or params)
    default_theta = 1_000_000.0 if raw.get("model_type") == "gemma3_text" else 10000.0
    theta = float(raw.get("rope_theta") or params.get("rope_theta") or default_theta)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type must be one of {', '.join(SUPPORTED_ROPE_TYPES)}, "
            f"got {rope_type!r}")
    if rope_type == "default":
        return theta, None
    scaling["rope_type"] = rope_type
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    if rope_type == "longrope":
        return theta, longrope_scaling(raw, scaling)
    if float(scaling.get("factor", 0.0)) <= 0.0:
        raise ValueError(f"rope_scaling.factor must be > 0, got {scaling.get('factor')!r}")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in scaling:
                raise ValueError(f"rope_scaling.{key} is required for rope_type 'llama3'")
        scaling.setdefault("original_max_position_embeddings",
                           int(raw.get("max_position_embeddings", 2048)))
    return theta, scaling


def _positive_int(raw: dict[str, Any], name: str) -> int:
    if name not in raw:
        raise ValueError(f"config.json is missing {name!r}")
    value = raw[name]
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json {name} must be a positive integer, got {value!r}")
    return value
