"""LogprobsLists rows from the core -> vLLM's per-position dict[token id, Logprob]."""

from __future__ import annotations

from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.outputs import Logprob, PromptLogprobs, SampleLogprobs
from strand.engine_core.processing.tokenizer import Tokenizer


class LogprobsProcessor:
    """Sample and prompt logprobs of one sequence; only kept when the request asked for them."""

    def __init__(
        self, tokenizer: Tokenizer | None, num_logprobs: int | None,
        num_prompt_logprobs: int | None, prompt_token_ids: list[int] | None = None,
        detokenize: bool = True,
    ) -> None:
        # None (detokenize=False, or no tokenizer at all): decoded_token stays None.
        self.tokenizer = tokenizer if detokenize else None
        self.prompt_token_ids = list(prompt_token_ids or [])
        self._sampled_ids: list[int] = []  # the sequence's output so far (decoding context)
        # The sampler gathers the batch's largest k for every row: each row is cut to this
        # request's own (the sampled token, then its top k; vLLM's zip with the ranks).
        self._row_width = (None if num_logprobs is None or num_logprobs < 0
                           else 1 + num_logprobs)
        self.logprobs: SampleLogprobs | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: PromptLogprobs | None = None if num_prompt_logprobs is None else []
        self._num_new_prompt_positions = 0  # prompt positions added since the last take

    def update_sample(self, rows: LogprobsLists | None) -> None:
        if rows is None or self.logprobs is None:
            return
        width = self._row_width
        for row in range(len(rows.logprob_token_ids)):
            one = LogprobsLists([rows.logprob_token_ids[row][:width]],
                                [rows.logprobs[row][:width]], [rows.sampled_token_ranks[row]])
            # A character may start in the prompt and end in the output.
            context = (self.prompt_token_ids[-_MAX_CONTEXT_TOKENS:]
                       + self._sampled_ids[-_MAX_CONTEXT_TOKENS:])[-_MAX_CONTEXT_TOKENS:]
            position = _to_dicts(self.tokenizer, one, [context])[0]
            self.logprobs.append(position)
            sampled_id = rows.logprob_token_ids[row][0]  # column 0 is the sampled token
            self._sampled_ids.append(sampled_id)
            assert self.cumulative_logprob is not None
            self.cumulative_logprob += position[sampled_id].logprob

    def update_prompt(self, rows: LogprobsLists | None) -> None:
        """Rows cover prompt positions 1.. in order, across chunks; position 0 has no logprob."""
        if rows is None or self.prompt_logprobs is None:
            return
        if not self.prompt_logprobs:
            self.prompt_logprobs.append(None)
            self._num_new_prompt_positions += 1
        # Row k is prompt position len(prompt_logprobs) + k: the tokens before it are its context.
        first = len(self.prompt_logprobs)
        contexts = [self.prompt_token_ids[max(0, p - _MAX_CONTEXT_TOKENS):p]
                    for p in range(first, first + len(rows.logprob_token_ids))]
        positions = _to_dicts(self.tokenizer, rows, contexts)
        self.prompt_logprobs.extend(positions)
        self._num_new_prompt_positions += len(positions)

    def take_new_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt positions added since the previous call (for DELTA outputs); None if none."""
        if self.prompt_logprobs is None:
            return None
        count = self._num_new_prompt_positions
        self._num_new_prompt_positions = 0
        return self.prompt_logprobs[len(self.prompt_logprobs) - count :] if count else None


# A UTF-8 character is at most 4 bytes; vLLM looks back as many tokens (a token may hold a
# byte plus other text).
_MAX_CONTEXT_TOKENS = 4
_REPLACEMENT = "\ufffd"


def _to_dicts(tokenizer: Tokenizer | None, rows: LogprobsLists, contexts: list[list[int]]
              ) -> list[dict[int, Logprob]]:
    """contexts[i]: the tokens before row i's position (for vLLM's UTF-8 correction)."""
    positions: list[dict[int, Logprob]] = []
    for token_ids, logprobs, sampled_rank, context in zip(
        rows.logprob_token_ids, rows.logprobs, rows.sampled_token_ranks, contexts, strict=True
    ):
        ranks = [sampled_rank, *range(1, len(token_ids))]
        position: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(token_ids, logprobs, ranks, strict=True):
            # The sampled token may also be in the top-k: one entry, same rank either way.
            if token_id not in position:
                position[token_id] = Logprob(
                    logprob=logprob,
                    rank=rank,
                    decoded_token=(decode_token(tokenizer, token_id, context)
                                   if tokenizer is not None else None),
                )
        positions.append(position)
    return positions


def decode_token(tokenizer: Tokenizer, token_id: int, context: list[int]) -> str:
    """The text one token adds after context; "" while it only holds part of a character.

    A byte-fallback token decodes alone to U+FFFD (a piece of a multi-byte character): vLLM
    decodes it together with the tokens before it instead, so no lone U+FFFD is reported.
    """
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if not text.endswith(_REPLACEMENT):
        return text
    for start in range(1, min(_MAX_CONTEXT_TOKENS, len(context)) + 1):
        before = context[-start:]
        joined = tokenizer.decode([*before, token_id], skip_special_tokens=False)
        if joined.endswith(_REPLACEMENT):
            continue
        # The earlier tokens' own text, less their unfinished character, is not this token's.
        prefix = tokenizer.decode(before, skip_special_tokens=False).rstrip(_REPLACEMENT)
        return joined[len(prefix):] if joined.startswith(prefix) else joined
    return ""
