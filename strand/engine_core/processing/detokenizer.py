"""Incremental detokenization of one sequence, with stop strings (vLLM's offsets algorithm).

Each step decodes a small window of token ids twice, without and with the new tokens, and emits the
difference. A window whose text ends in U+FFFD is an incomplete UTF-8 character (a byte-level piece
of "中" or an emoji): nothing is emitted until a later token completes it, or the sequence ends.

Where the tokenizer's own decode gives the text (every case but special tokens kept with spaces
between them), `tokenizers`' DecodeStream runs the same algorithm in Rust: one call a token instead
of two decodes and the list slicing around them, the larger part of the detokenizer stage's CPU per
token. The window's offsets are kept here alongside, so the Python path can take over at any token
(the end of a sequence that stops mid-character, a decoder whose text is not append-only).
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as decoding context: a sentencepiece decoder drops the leading space of the
# first piece it sees, so the first generated word needs its predecessors to keep its space.
NUM_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.spaces_between_special_tokens = params.spaces_between_special_tokens
        self.stop = list(params.stop)
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        # While streaming, hold back the tail that could still become a stop string, so text is
        # never sent and then taken back.
        self.stop_buffer_length = (
            max((len(s) for s in self.stop), default=1) - 1
            if not self.include_stop_str_in_output
            else 0
        )
        context = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self._ids: list[int] = context  # decoding window source: context + output ids
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.num_output_tokens = 0
        self.output_text = ""
        self._last_output_text_offset = 0
        self._stream = self._open_stream(context)

    def update(self, new_token_ids: list[int], stop_terminated: bool, finished: bool) -> str | None:
        """Append this step's tokens; return the stop string that ended the sequence, if any.

        stop_terminated: the core stopped on eos or a stop token id (the last of new_token_ids);
        that token stays out of the text unless include_stop_str_in_output.
        """
        if stop_terminated and new_token_ids and not self.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
        start_len = len(self.output_text)
        # Joined once: the engine stage's held tokens come 100+ at once.
        pieces = []
        for token_id in new_token_ids:
            self._ids.append(token_id)
            pieces.append(self._step_stream(token_id) if self._stream is not None
                          else self._decode_window(final=False))
        self.num_output_tokens += len(new_token_ids)
        self.output_text += "".join(pieces)
        if finished:
            self.output_text += self._decode_window(final=True)
        if not self.stop or self.num_output_tokens <= self.min_tokens:
            return None
        return self._check_stop_strings(len(self.output_text) - start_len)

    def flush(self) -> None:
        """The sequence ended outside the core (error): emit any held incomplete character."""
        self.output_text += self._decode_window(final=True)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The whole text so far, or (delta) only what was not returned before."""
        buffer_length = 0 if finished else self.stop_buffer_length
        length = len(self.output_text) - buffer_length
        if not delta:
            return self.output_text[:length] if buffer_length else self.output_text
        last = self._last_output_text_offset
        if last >= length:
            return ""
        self._last_output_text_offset = length
        return self.output_text[last:length]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def _open_stream(self, context: list[int]) -> DecodeStream | None:
        """A DecodeStream primed with the context, where it gives what _decode_window would."""
        if not self.skip_special_tokens and self.spaces_between_special_tokens:
            return None  # Tokenizer.decode's slow-tokenizer spacing, which the stream lacks
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            # The stream would take the context's text for new text (it sets no prefix from a
            # context that ends mid-character).
            return None
        return DecodeStream(ids=context, skip_special_tokens=self.skip_special_tokens)

    def _step_stream(self, token_id: int) -> str:
        assert self._stream is not None
        try:
            text = self._stream.step(self.tokenizer.backend, token_id)
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception (InvalidPrefix)
            # A decoder whose text is not append-only: the window decodes this sequence from here.
            self._stream = None
            return self._decode_window(final=False)
        if text is None:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return text

    def _decode_window(self, final: bool) -> str:
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text):
            # Nothing visible yet (a skipped special token); at the end there is nothing to add.
            return ""
        if new_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""  # an incomplete UTF-8 character: wait for the bytes that complete it
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _check_stop_strings(self, new_char_count: int) -> str | None:
        """Find the earliest stop string touching the new text and cut the text there."""
        text = self.output_text
        best: tuple[int, str] | None = None
        for stop in self.stop:
            # Only text that includes a new character can hold a match not seen before.
            start = max(0, len(text) - new_char_count - len(stop) + 1)
            index = text.find(stop, start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        end = index + len(stop) if self.include_stop_str_in_output else index
        self.output_text = text[:end]
        return stop
