"""``ignisd lint --model M TRACE``: ``ignis lint`` without a daemon. Only the model's tokenizer and chat template are
loaded (the weights are not read), and each trace entry is rendered exactly as the daemon's ``tokenize`` op renders
it (ignisd.fronts.bodies.tokenize_body over ignisd.prompt.Prompts). †: imports no torch.

    ignisd lint [--model PATH|builtin] [--server-strip-billing-header on|off] [--server-canonicalize-tools on|off]
                [--server-developer-message-policy P] TRACE [--json] [--prefill-rate TOK_S] [--color WHEN]

The three server keys default as the daemon's do (DESIGN §6), so lint sees what a daemon started with the same flags
renders. --model reads as serve's model.path does ("builtin" is the built-in model). Without --prefill-rate the
seconds lost are not priced. Exit status 0; 1 when the trace cannot be read or none of its lines could be used; 2
when the model cannot be opened or the command line is refused.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ignis_client.cli import add_lint_arguments, run_lint

from ignisd.config_keys import DEVELOPER_POLICIES, ConfigError, _apply
from ignisd.fronts.bodies import tokenize_body
from ignisd.model.builtin import builtin_model_path
from ignisd.prompt import Prompts
from ignisd.text.chat_template import ChatTemplate


def _bool(v: str) -> bool:
    if v.lower() in ("on", "true", "1", "yes"):
        return True
    if v.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be on or off, got {v!r}")


def _model_path(v: str) -> str | None:
    """--model as ``ignisd serve`` reads model.path: "builtin" (or "") is the built-in model (None); a ConfigError
    becomes argparse's error (exit 2)."""
    try:
        return _apply("model.path", v, True, "flag --model")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_prompts(model: str | None, developer_policy: str = "into-system", canonicalize_tools: bool = False) \
        -> Prompts:
    """Prompts (tokenizer + chat template) of the model at `model` — a GGUF file, an HF-style directory with
    tokenizer.json, or a directory holding one .gguf; None: the built-in model — without reading its weights.
    Raises OSError (FileNotFoundError when the built-in model is not installed) / ValueError / KeyError when nothing
    usable is there."""
    from ignisd.text.tokenizer import Tokenizer
    p = builtin_model_path() if model is None else Path(model).expanduser()
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if (p / "tokenizer.json").is_file():
            tok = Tokenizer.from_dir(p)
        elif len(ggufs) == 1:
            tok = Tokenizer.from_gguf(ggufs[0])
        else:
            raise FileNotFoundError(f"{p}: no tokenizer.json and {len(ggufs)} .gguf files (need exactly one)")
    elif p.is_file():
        tok = Tokenizer.from_gguf(p)
    else:
        raise FileNotFoundError(f"{p}: no such file or directory")
    template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token) if tok.chat_template else None
    return Prompts(tok, template, developer_policy, canonicalize_tools)


def renderer(prompts: Prompts, strip_billing: bool = True):
    """render(entry) → the tokenize result of a trace entry (ignis_client.trace.TraceEntry), as the daemon renders
    it. Raises ProtocolError naming the body's field."""
    def render(entry):
        return tokenize_body(prompts, entry.shape, entry.body, strip_billing, True, f"line{entry.line}")
    return render


def main(argv: list[str]) -> int:
    """Entry point of `ignisd lint`; returns the exit status."""
    p = argparse.ArgumentParser(prog="ignisd lint", description="Explain why a trace's prompts miss the retained "
                                                                "prefix, rendering with the model's own template.")
    p.add_argument("--model", type=_model_path, default=None,
                   help='GGUF file or HF-style directory, or "builtin" (the default: the built-in model)')
    p.add_argument("--server-strip-billing-header", type=_bool, default=True, metavar="on|off")
    p.add_argument("--server-canonicalize-tools", type=_bool, default=False, metavar="on|off")
    p.add_argument("--server-developer-message-policy", choices=DEVELOPER_POLICIES, default="into-system")
    add_lint_arguments(p)
    args = p.parse_args(argv)
    try:
        prompts = load_prompts(args.model, args.server_developer_message_policy, args.server_canonicalize_tools)
    except (OSError, ValueError, KeyError) as e:
        print(f"ignisd lint: model {args.model or '(built-in)'}: cannot load its tokenizer: {e}", file=sys.stderr)
        return 2
    return run_lint(args, renderer(prompts, args.server_strip_billing_header), None)
