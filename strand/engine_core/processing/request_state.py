"""One sequence's state in the output processor: its tokens, text, logprobs and finish."""

from __future__ import annotations

from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.outputs import CompletionOutput
from strand.engine_core.processing.detokenizer import IncrementalDetokenizer
from strand.engine_core.processing.logprobs import LogprobsProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams


class SequenceState:
    """A child request as the core sees it (for n == 1 the child id is the parent id)."""

    def __init__(
        self,
        request_id: str,
        index: int,
        tokenizer: Tokenizer | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        self.request_id = request_id
        self.index = index
        # detokenize=False (vLLM; always so without a tokenizer): token ids only, no text, no
        # decoded_token.
        self.detokenizer = (IncrementalDetokenizer(tokenizer, prompt_token_ids, params)
                            if params.detokenize and tokenizer is not None else None)
        self.logprobs = LogprobsProcessor(tokenizer, params.logprobs, params.prompt_logprobs,
                                          prompt_token_ids, detokenize=params.detokenize)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._num_sent_tokens = 0  # what DELTA outputs already carried
        self._num_sent_logprobs = 0
        self._sent_finish = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput) -> bool:
        """Apply one step of the core; True when a stop string ended it (the core must abort it)."""
        self.token_ids.extend(output.new_token_ids)
        self.logprobs.update_sample(output.new_logprobs)
        self.logprobs.update_prompt(output.new_prompt_logprobs)
        stop_terminated = output.finish_reason == "stop"
        stop_string = self.detokenizer.update(
            output.new_token_ids, stop_terminated, finished=output.finished
        ) if self.detokenizer is not None else None
        if stop_string is not None:
            self.finish_reason = "stop"
            self.stop_reason = stop_string
            return not output.finished
        if output.finished:
            self.finish_reason = output.finish_reason
            self.stop_reason = output.stop_reason
        return False

    def finish(self, reason: str) -> None:
        if self.detokenizer is not None:
            self.detokenizer.flush()
        self.finish_reason = reason
        self.stop_reason = None

    def has_news(self) -> bool:
        """New tokens or a finish that no DELTA output has carried yet."""
        return len(self.token_ids) > self._num_sent_tokens or (
            self.finished and not self._sent_finish
        )

    def ready_to_stream(self, stream_interval: int) -> bool:
        """Whether a streaming output should carry this sequence now: it has news, and it is
        the first output, the last, or stream_interval tokens have gathered (vLLM's rule)."""
        if not self.has_news():
            return False
        if stream_interval <= 1 or self.finished or self._num_sent_tokens == 0:
            return True
        return len(self.token_ids) - self._num_sent_tokens >= stream_interval

    def completion(self, delta: bool) -> CompletionOutput:
        text = (self.detokenizer.get_next_output_text(self.finished, delta)
                if self.detokenizer is not None else "")
        logprobs = self.logprobs.logprobs
        if delta:
            token_ids = self.token_ids[self._num_sent_tokens :]
            if logprobs is not None:
                logprobs = logprobs[self._num_sent_logprobs :]
        else:
            # Copies: the caller keeps outputs while this state keeps growing.
            token_ids = list(self.token_ids)
            if logprobs is not None:
                logprobs = list(logprobs)
        self._num_sent_tokens = len(self.token_ids)
        self._sent_finish = self.finished
        self._num_sent_logprobs = 0 if self.logprobs.logprobs is None else len(
            self.logprobs.logprobs
        )
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self.logprobs.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
