"""A user's mistake ends in one clear line and exit code 1, not a wall of tracebacks.

`--debug` (the `strand` CLI) or STRAND_LOG_LEVEL=DEBUG shows the traceback as well. The level is
inherited by the services `strand serve` starts, so their logs follow the same switch.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from strand import envs

LOG_LEVEL_ENV = "STRAND_LOG_LEVEL"


class UserError(Exception):
    """A mistake the user can fix (a wrong path, a taken port): its message is the whole story."""


def debug_enabled() -> bool:
    return envs.log_level() == "DEBUG"


def log_level() -> int:
    """STRAND_LOG_LEVEL (DEBUG, INFO, WARNING, ...); INFO when unset or not a level name."""
    level = logging.getLevelName(envs.log_level() or "INFO")
    return level if isinstance(level, int) else logging.INFO


def setup_logging() -> None:
    logging.basicConfig(level=log_level())


def describe(exc: BaseException) -> str:
    """One line for exc: its message where it was written for the user, else its type too."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, UserError | ValueError | OSError):
        return text
    return f"{type(exc).__name__}: {text}"


def fail(prog: str, message: str, hint: bool = True) -> NoReturn:
    more = " (--debug or STRAND_LOG_LEVEL=DEBUG shows the traceback)"
    hint_text = more if hint and not debug_enabled() else ""
    print(f"{prog}: error: {message}{hint_text}", file=sys.stderr, flush=True)
    sys.exit(1)


def run_main(prog: str, body: Callable[[], None]) -> None:
    """Run body; any exception (Ctrl-C included) becomes one line on stderr and exit code 1."""
    try:
        body()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the point: nothing escapes as a traceback
        if debug_enabled():
            traceback.print_exc()
        if isinstance(exc, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            sys.exit(1)
        # A UserError or ValueError message names the field and what to do: a hint is noise.
        fail(prog, describe(exc), hint=not isinstance(exc, UserError | ValueError))


def _gguf_weights(path: Path) -> bool:
    """Whether the directory was converted from a GGUF file that holds its weights."""
    from strand.engine_core.model_executor.gguf.convert import weights_file

    try:
        return weights_file(path) is not None
    except FileNotFoundError as exc:  # the file it was converted from is gone: say so
        raise UserError(str(exc)) from exc


def check_model_dir(model: str, tokenizer: str | None = None,
                    needs_tokenizer: bool = True) -> None:
    """UserError unless `model` is a HF model directory with a config, weights and a tokenizer
    (tokenizer.json there, or in `tokenizer` when given; none with needs_tokenizer False:
    --skip-tokenizer-init)."""
    path = Path(model)
    if not path.exists():
        raise UserError(f"model directory {model!r} does not exist (--model)")
    if not path.is_dir():
        raise UserError(f"--model {model!r} is not a directory (a local HF model directory "
                        f"with config.json, *.safetensors and tokenizer.json)")
    if not (path / "config.json").exists():
        raise UserError(f"--model {model!r} is not a HF model directory: no config.json in it")
    if not any(path.glob("*.safetensors")) and not _gguf_weights(path):
        raise UserError(f"--model {model!r} has no *.safetensors weights")
    tokenizer_dir = Path(tokenizer) if tokenizer else path
    if needs_tokenizer and not (tokenizer_dir / "tokenizer.json").exists():
        flag = "--tokenizer" if tokenizer else "--model"
        raise UserError(f"{flag} {str(tokenizer_dir)!r} has no tokenizer.json (or pass "
                        f"--skip-tokenizer-init to serve token ids only)")
