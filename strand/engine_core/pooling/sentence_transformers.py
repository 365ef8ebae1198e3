"""A sentence-transformers model directory's pooling, as vLLM reads it: modules.json lists the
modules run after the transformer, and the Pooling module's config.json says which tokens it
pools (`pooling_mode_lasttoken`, `_mean_tokens`, `_cls_token`); a Normalize module means the
embedding is L2-normalised. These are the engine's pooler_config defaults for such a model;
the user's pooler_config still wins. A module the engine does not run (Dense projections, max
or weighted-mean pooling) is refused by name: the embeddings would not be the model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
_TRANSFORMER = "sentence_transformers.models.Transformer"
# Pooling config.json's modes -> pooler_config.pooling_type; the other modes are refused.
_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN",
          "pooling_mode_cls_token": "CLS"}
_UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens")


def pooler_defaults(model_dir: str | Path) -> dict[str, Any]:
    """pooler_config keys from the directory's modules.json ({} without one). ValueError naming
    the module or mode the engine does not run."""
    root = Path(model_dir)
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return {}
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    if not isinstance(modules, list):
        raise ValueError(f"{modules_file} must hold a list of modules")
    defaults: dict[str, Any] = {"normalize": False}
    for module in modules:
        kind = str(module.get("type", ""))
        if kind == _TRANSFORMER:
            continue
        if kind == _NORMALIZE:
            defaults["normalize"] = True
        elif kind == _POOLING:
            defaults["pooling_type"] = _pooling_type(root / str(module.get("path", "")))
        else:
            raise ValueError(f"{modules_file} lists {kind} ({module.get('path')}), which this "
                             "engine does not run: its embeddings would not be the model's")
    return defaults


def _pooling_type(folder: Path) -> str:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"the sentence-transformers Pooling module has no {config_file}")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    unsupported = [mode for mode in _UNSUPPORTED_MODES if config.get(mode)]
    if unsupported or config.get("include_prompt") is False:
        what = unsupported or ["include_prompt: false"]
        raise ValueError(f"{config_file} asks for {', '.join(what)}; this engine pools "
                         f"{' / '.join(_MODES.values())} over the whole prompt")
    chosen = [kind for mode, kind in _MODES.items() if config.get(mode)]
    if len(chosen) != 1:
        raise ValueError(f"{config_file} must turn on exactly one of {sorted(_MODES)}, got "
                         f"{chosen or 'none'}")
    return chosen[0]
