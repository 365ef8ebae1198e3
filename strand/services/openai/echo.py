"""Completions' `echo` (vLLM's): each choice's text begins with its prompt, and with `logprobs`
its logprobs begin with the prompt's (the engine's prompt_logprobs, the first token's logprob
null). `max_tokens: 0` with echo returns the prompt alone (the engine samples one token, which
is not shown): the shape lm-evaluation-harness scores loglikelihoods with."""

from __future__ import annotations

from dataclasses import dataclass, field

from strand.engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from strand.services.async_client import AsyncEngineClient
from strand.services.common.convert import PromptType

Position = dict[int, Logprob] | None


@dataclass(slots=True)
class Echo:
    texts: list[str]  # each job's prompt text, as it is echoed
    first_tokens: list[str]  # each job's first prompt token as text (it has no logprob row)
    only: bool  # max_tokens 0: the prompt alone
    prompt_logprobs: dict[int, list[Position]] = field(default_factory=dict)  # job -> so far
    sent: set[int] = field(default_factory=set)  # choices whose prompt went out

    def collect(self, job: int, out: RequestOutput) -> None:
        """A job's prompt logprobs, which DELTA outputs may bring in parts."""
        if out.prompt_logprobs:
            self.prompt_logprobs.setdefault(job, []).extend(out.prompt_logprobs)

    def choice(self, job: int, index: int, out: RequestOutput, c: CompletionOutput
               ) -> tuple[str, list[int], list[Position], str | None] | None:
        """(text, token ids, logprob rows, the first token's text) of the choice's next part,
        the prompt first; None while a stream has nothing for it to show yet."""
        rows: list[Position] = [] if self.only else list(c.logprobs or [])
        text, token_ids = ("", []) if self.only else (c.text, c.token_ids)
        if index in self.sent:
            return text, token_ids, rows, None
        if not c.token_ids and not c.finished():
            return None  # a prefill chunk's output: the prompt goes with the first token
        self.sent.add(index)
        prompt_rows = self.prompt_logprobs.get(job, [])
        return (self.texts[job] + text, [*out.prompt_token_ids, *token_ids],
                [*prompt_rows, *rows], self.first_tokens[job])


async def prepare_echo(client: AsyncEngineClient, prompts: list[PromptType], only: bool,
                       logprobs: bool) -> Echo:
    """Each prompt's text (token-id prompts detokenized, as vLLM does) and, with logprobs, its
    first token's text, from the tokenizer stage."""
    texts, first_tokens = [], []
    for prompt in prompts:
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        texts.append(await client.detokenize(ids) if ids is not None else str(prompt))
        if logprobs:
            first = ids[:1] if ids is not None else (await client.tokenize(prompt))["tokens"][:1]
            first_tokens.append(await client.detokenize(first))
        else:
            first_tokens.append("")
    return Echo(texts, first_tokens, only)
