"""SamplingMetadata: one step's sampling parameters as batched tensors, built once per step.

The runner hands one SamplingRow per request row; build_sampling_metadata turns them into
tensors and flags so the sampler runs the batch with no per-request Python loop, and skips
every stage that no row needs (an all-greedy batch with no masks is a bare argmax).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.nn.utils.rnn import pad_sequence

from strand.engine_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import xgrammar as xg

    from strand.engine_core.structured_output.bitmask import GrammarMask


@dataclass(slots=True)
class SamplingRow:
    """One request row of this step's batch."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far (penalties, min_tokens)
    generator: torch.Generator | None  # per-request, created once from params.seed by the runner
    eos_token_id: int | None
    # The request's grammar matcher (params.structured_outputs), advanced by the runner on each
    # accepted token; None: unconstrained.
    grammar: xg.GrammarMatcher | None = None


@dataclass(slots=True)
class PenaltyMetadata:
    """Present only when some row has a presence, frequency or repetition penalty."""

    presence: torch.Tensor  # [num_reqs] float32, 0 = off
    frequency: torch.Tensor  # [num_reqs] float32, 0 = off
    repetition: torch.Tensor  # [num_reqs] float32, 1 = off
    # [num_reqs, max_output_len] int64, padded with vocab_size (a scratch column for scatter_add).
    output_token_ids: torch.Tensor
    # [num_reqs, max_prompt_len] int64, padded with vocab_size; None when no repetition penalty.
    prompt_token_ids: torch.Tensor | None


@dataclass(slots=True)
class TokenMasks:
    """Edits to the logits before penalties; each part is None when no row needs it."""

    # Sparse additive bias: logits[bias_rows[i], bias_cols[i]] += bias_values[i].
    bias_rows: torch.Tensor | None = None  # [num_biases] int64
    bias_cols: torch.Tensor | None = None  # [num_biases] int64
    bias_values: torch.Tensor | None = None  # [num_biases] float32
    # [num_reqs, vocab] bool, True = not in the row's allowed_token_ids (set to -inf).
    disallowed: torch.Tensor | None = None
    # (row, token) pairs banned until min_tokens is reached: stop ids and EOS.
    banned_rows: torch.Tensor | None = None  # [num_banned] int64
    banned_cols: torch.Tensor | None = None  # [num_banned] int64

    @property
    def is_empty(self) -> bool:
        return self.bias_rows is None and self.disallowed is None and self.banned_rows is None


@dataclass(slots=True)
class SamplingMetadata:
    num_reqs: int
    vocab_size: int
    all_greedy: bool
    all_random: bool
    # [num_reqs] float32: each random row's temperature; 1.0 on greedy rows so dividing is safe.
    # None when all rows are greedy.
    temperature: torch.Tensor | None
    # [num_reqs] bool, True = argmax row; None when the batch is all greedy or all random.
    greedy_mask: torch.Tensor | None
    # [num_reqs] int64 in [1, vocab_size] (vocab_size = off); None when no random row uses it.
    top_k: torch.Tensor | None
    # The largest top_k below vocab_size among random rows (host int, so no sync to read it).
    max_top_k: int
    top_p: torch.Tensor | None  # [num_reqs] float32, 1.0 = off; None when no random row uses it
    min_p: torch.Tensor | None  # [num_reqs] float32, 0.0 = off; None when no random row uses it
    # Row index -> its own generator: seeded random rows only.
    generators: dict[int, torch.Generator]
    penalties: PenaltyMetadata | None
    masks: TokenMasks
    # The largest params.logprobs of the batch; None when no row asked for logprobs.
    max_num_logprobs: int | None
    # Rows whose params asked for sample logprobs (for the caller; all rows are computed).
    logprob_rows: list[int] = field(default_factory=list)
    # The rows themselves, for custom logits processors' batch updates.
    rows: list[SamplingRow] = field(default_factory=list)
    # Allowed next tokens of the grammar-constrained rows; None when no row has a grammar.
    grammar: GrammarMask | None = None


def argmax_only(params: SamplingParams, eos_token_id: int | None, vocab_size: int) -> bool:
    """The sampler takes this request's token as the bare argmax of the logits at every step:
    greedy, with nothing that edits the logits (penalties, bias, allowed ids, min_tokens, bad
    words, a grammar) or asks for logprobs, and nothing build_sampling_metadata's checks would
    refuse (a row's stop ids and eos in the vocabulary). Custom logits processors are the
    sampler's, checked by the caller."""
    return (params.is_greedy and params.logprobs is None and params.structured_outputs is None
            and params.min_tokens == 0 and not params.logit_bias
            and params.allowed_token_ids is None and not params.bad_words_token_ids
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
            and params.repetition_penalty == 1.0
            and all(0 <= t < vocab_size for t in params.stop_token_ids)
            and (eos_token_id is None or 0 <= eos_token_id < vocab_size))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A request's own generator: its samples then do not depend on the rest of the batch."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def build_sampling_metadata(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> SamplingMetadata:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if not rows:
        raise ValueError("rows must hold at least one SamplingRow, got 0")
    for row in rows:
        _validate_row(row, vocab_size)

    greedy = [row.params.is_greedy for row in rows]
    all_greedy = all(greedy)
    all_random = not any(greedy)
    knobs = _RandomKnobs(vocab_size) if all_greedy else _random_knobs(rows, greedy, vocab_size,
                                                                       device)

    generators = {
        i: row.generator
        for i, (row, g) in enumerate(zip(rows, greedy, strict=True))
        if row.generator is not None and not g
    }
    asked = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    # -1 asks for the whole vocabulary.
    max_num_logprobs = max((_num_logprobs(rows[i].params.logprobs, vocab_size) for i in asked),
                           default=None)

    return SamplingMetadata(
        num_reqs=len(rows),
        vocab_size=vocab_size,
        all_greedy=all_greedy,
        all_random=all_random,
        temperature=knobs.temperature,
        greedy_mask=knobs.greedy_mask,
        top_k=knobs.top_k,
        max_top_k=knobs.max_top_k,
        top_p=knobs.top_p,
        min_p=knobs.min_p,
        generators=generators,
        penalties=_build_penalties(rows, vocab_size, device),
        masks=_build_masks(rows, vocab_size, device),
        max_num_logprobs=max_num_logprobs,
        logprob_rows=asked,
        rows=list(rows),
        grammar=_build_grammar_mask(rows, vocab_size),
    )


def _build_grammar_mask(rows: list[SamplingRow], vocab_size: int) -> GrammarMask | None:
    if all(row.grammar is None for row in rows):
        return None  # xgrammar is imported only once some request asks for a grammar
    from strand.engine_core.structured_output.bitmask import build_grammar_mask

    return build_grammar_mask([row.grammar for row in rows],
                              [row.eos_token_id for row in rows], vocab_size)


@dataclass(slots=True)
class _RandomKnobs:
    """The sampled rows' temperature and truncations; None where no row in the batch uses one
    (the sampler then skips that pass)."""

    max_top_k: int
    temperature: torch.Tensor | None = None
    greedy_mask: torch.Tensor | None = None  # only in a batch mixing greedy and sampled rows
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None


def _random_knobs(rows: list[SamplingRow], greedy: list[bool], vocab_size: int,
                  device: torch.device) -> _RandomKnobs:
    knobs = _RandomKnobs(vocab_size)
    knobs.temperature = _f32([1.0 if g else row.params.temperature
                              for row, g in zip(rows, greedy, strict=True)], device)
    if any(greedy):
        knobs.greedy_mask = torch.tensor(greedy, dtype=torch.bool, device=device)
    random_params = [row.params for row, g in zip(rows, greedy, strict=True) if not g]
    ks = [_effective_top_k(row.params, vocab_size) for row in rows]
    random_ks = [k for k, g in zip(ks, greedy, strict=True) if not g and k < vocab_size]
    if random_ks:
        knobs.top_k = torch.tensor(ks, dtype=torch.int64, device=device)
        # Rows with top_k off do not count: topk(max_top_k) stays small next to the vocab.
        knobs.max_top_k = max(random_ks)
    if any(p.top_p < 1.0 for p in random_params):
        knobs.top_p = _f32([row.params.top_p for row in rows], device)
    if any(p.min_p > 0.0 for p in random_params):
        knobs.min_p = _f32([row.params.min_p for row in rows], device)
    return knobs


def _num_logprobs(value: int | None, vocab_size: int) -> int:
    return vocab_size if value == -1 else (value or 0)


def _effective_top_k(params: SamplingParams, vocab_size: int) -> int:
    return vocab_size if params.top_k <= 0 else min(params.top_k, vocab_size)


def _f32(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _build_penalties(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> PenaltyMetadata | None:
    params = [row.params for row in rows]
    use_repetition = any(p.repetition_penalty != 1.0 for p in params)
    if not use_repetition and not any(
        p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params
    ):
        return None
    prompt_ids = None
    if use_repetition:
        prompt_ids = _padded_ids([row.prompt_token_ids for row in rows], vocab_size,
                                 "prompt_token_ids").to(device)
    return PenaltyMetadata(
        presence=_f32([p.presence_penalty for p in params], device),
        frequency=_f32([p.frequency_penalty for p in params], device),
        repetition=_f32([p.repetition_penalty for p in params], device),
        output_token_ids=_padded_ids([row.output_token_ids for row in rows], vocab_size,
                                     "output_token_ids").to(device),
        prompt_token_ids=prompt_ids,
    )


def _padded_ids(lists: list[list[int]], vocab_size: int, name: str) -> torch.Tensor:
    """[num_reqs, max_len] int64 on the host, padded with vocab_size; ids checked in one pass."""
    tensors = [torch.tensor(ids, dtype=torch.int64) for ids in lists]
    flat = torch.cat(tensors)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ValueError(f"{name} must be token ids in [0, {vocab_size})")
    return pad_sequence(tensors, batch_first=True, padding_value=vocab_size)


def _build_masks(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> TokenMasks:
    masks = TokenMasks()
    bias_rows: list[int] = []
    bias_cols: list[int] = []
    bias_values: list[float] = []
    allowed_rows: list[int] = []
    allowed_cols: list[int] = []
    banned_rows: list[int] = []
    banned_cols: list[int] = []
    for i, row in enumerate(rows):
        params = row.params
        if params.logit_bias:
            bias_rows.extend([i] * len(params.logit_bias))
            bias_cols.extend(int(t) for t in params.logit_bias)
            bias_values.extend(float(v) for v in params.logit_bias.values())
        if params.allowed_token_ids is not None:
            allowed_rows.extend([i] * len(params.allowed_token_ids))
            allowed_cols.extend(params.allowed_token_ids)
        if len(row.output_token_ids) < params.min_tokens:
            stop_ids = set(params.stop_token_ids)
            if row.eos_token_id is not None and not params.ignore_eos:
                stop_ids.add(row.eos_token_id)
            banned_rows.extend([i] * len(stop_ids))
            banned_cols.extend(sorted(stop_ids))
        if params.bad_words_token_ids:
            banned = _bad_word_bans(params.bad_words_token_ids, row.output_token_ids)
            banned_rows.extend([i] * len(banned))
            banned_cols.extend(banned)

    def ids(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    if bias_rows:
        masks.bias_rows, masks.bias_cols = ids(bias_rows), ids(bias_cols)
        masks.bias_values = _f32(bias_values, device)
    if allowed_rows:
        disallowed = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
        disallowed[ids(sorted(set(allowed_rows)))] = True
        disallowed[ids(allowed_rows), ids(allowed_cols)] = False
        masks.disallowed = disallowed
    if banned_rows:
        masks.banned_rows, masks.banned_cols = ids(banned_rows), ids(banned_cols)
    return masks


def _bad_word_bans(words: list[list[int]], output_token_ids: list[int]) -> list[int]:
    """vLLM's bad words: a word's last token is banned when the output ends with the rest of
    it (a one-token word is always banned)."""
    banned = []
    for ids in words:
        prefix = ids[:-1]
        if not prefix or output_token_ids[len(output_token_ids) - len(prefix):] == prefix:
            banned.append(ids[-1])
    return banned


def _validate_row(row: SamplingRow, vocab_size: int) -> None:
    params = row.params
    if (params.stop_token_ids or params.allowed_token_ids or params.logit_bias
            or params.bad_words_token_ids):
        params.validate_against_vocab(vocab_size)
    if row.eos_token_id is not None and not 0 <= row.eos_token_id < vocab_size:
        raise ValueError(f"eos_token_id must be in [0, {vocab_size}), got {row.eos_token_id}")
