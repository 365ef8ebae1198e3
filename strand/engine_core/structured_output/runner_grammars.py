"""The model runner's side of structured outputs: a matcher per constrained request, created
when the request (re)joins the batch and advanced on each token the runner samples for it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from strand.engine_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import xgrammar as xg

    from strand.engine_core.structured_output.grammar import GrammarCache

logger = logging.getLogger(__name__)


class RunnerGrammars:
    def __init__(self) -> None:
        self.cache: GrammarCache | None = None  # set by the engine core (it has the tokenizer)

    def matcher_for(self, params: SamplingParams, output_token_ids: list[int],
                    eos_token_id: int | None) -> xg.GrammarMatcher | None:
        """A matcher advanced past output_token_ids: a request resumed after preemption keeps
        its output, so its grammar state is rebuilt by replaying it (cheap next to the
        recomputed forward)."""
        if params.structured_outputs is None:
            return None
        if self.cache is None:
            raise RuntimeError("a request asks for structured_outputs but the runner has no "
                               "grammar compiler (the engine core sets one)")
        matcher = self.cache.new_matcher(params.structured_outputs, eos_token_id)
        for token in output_token_ids:
            if matcher.is_terminated():
                break  # ignore_eos: EOS tokens past the end of the grammar
            if not matcher.accept_token(token):
                logger.error("resumed request: output token %d is outside its grammar", token)
                break
        return matcher

    @staticmethod
    def accept(req_id: str, matcher: xg.GrammarMatcher, token: int) -> None:
        # The bitmask allowed only grammar tokens; a refusal means another mask (a custom
        # logits processor, allowed_token_ids) left the row with nothing the grammar allows.
        if not matcher.is_terminated() and not matcher.accept_token(token):
            logger.error("request %s: sampled token %d is outside its grammar (another mask "
                         "excluded every token the grammar allows)", req_id, token)
