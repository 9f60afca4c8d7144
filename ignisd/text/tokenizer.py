"""The model's tokenizer: byte-level BPE built with the `tokenizers` library.

Two sources:

* ``Tokenizer.from_gguf(path)``: a GGUF has no ``tokenizer.json``; it stores the vocabulary, the merges, a
  type per token and the special token ids as metadata (llama.cpp key names, read with the ``gguf`` package).
  The tokenizer built here is the one transformers builds when it loads the same file
  (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, transformers 5.24
  ``integrations/gguf/gguf_tokenizer_mapping.py``): a ``BPE`` model over the vocabulary (tokens that use
  characters outside the GPT-2 byte alphabet are re-spelled in it), no normalizer, the GPT-2 ``ByteLevel``
  pre-tokenizer (``add_prefix_space=False``, GPT-2 split regex) and ``ByteLevel`` decoder; tokens of type
  CONTROL (3) become special added tokens, USER_DEFINED (4) plain added tokens.

  Note on ``tokenizer.ggml.pre = "smollm"``: transformers has no split rule for it and falls back to the
  GPT-2 regex, while llama.cpp (and SmolLM2's own ``tokenizer.json``) split every digit off first. The
  vocabulary has no merges involving digits, so the two differ only on a whitespace run right before a digit
  (``"a  1"``: transformers ``a|Ġ|Ġ|1``, the original ``a|ĠĠ|1``). We follow transformers, the project's oracle.

* ``Tokenizer.from_dir(path)``: ``tokenizer.json`` (+ ``tokenizer_config.json`` for the special tokens and
  the chat template, or ``chat_template.jinja``; ``generation_config.json`` / ``config.json`` for extra eos ids).

No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

# llama.cpp token types (gguf.TokenType)
_CONTROL = 3
_USER_DEFINED = 4

# ``tokenizer.ggml.pre`` values for which transformers keeps the GPT-2 ByteLevel split (no own regex).
_GPT2_SPLIT_PRE = frozenset({"default", "gpt-2", "gpt2", "smollm"})

# Tokens that end a turn in common chat formats (ChatML, Llama 3, Phi 3, Gemma). One counts as a stop token
# when it is a special token of the vocabulary and the chat template writes it.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


def _gguf_value(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _token_content(value) -> str | None:
    """A special token entry of tokenizer_config.json: a string or an AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _ids(value) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class Tokenizer:
    """Encode/decode text for one model; wraps a ``tokenizers.Tokenizer``.

    Attributes:
        vocab_size: number of token ids the tokenizer knows (GGUF: ``len(tokenizer.ggml.tokens)``; directory:
            the tokenizer.json vocabulary plus its added tokens).
        bos_token_id, eos_token_id: int or None. bos_token, eos_token: their text, or None.
        stop_token_ids: set[int]: eos, the GGUF's eot/eom ids, a directory's generation_config eos ids, and every
            token of ``END_OF_TURN_TOKENS`` that is special and appears in the chat template (``<|im_end|>``).
        special_token_ids: frozenset[int] of the added tokens marked special (skipped by
            ``decode(..., skip_special_tokens=True)``).
        chat_template: the jinja source, or None.
        add_bos_token: whether the source asks for BOS before a raw prompt (``encode`` never adds it).
        backend: the ``tokenizers.Tokenizer``.
    """

    def __init__(self, backend: _HFTokenizer, *, bos_token_id: int | None, eos_token_id: int | None,
                 chat_template: str | None, extra_stop_ids=(), add_bos_token: bool = False):
        self.backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.bos_token: str | None = backend.id_to_token(bos_token_id) if bos_token_id is not None else None
        self.eos_token: str | None = backend.id_to_token(eos_token_id) if eos_token_id is not None else None
        self.chat_template = chat_template
        self.add_bos_token = bool(add_bos_token)
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
        stops = set(extra_stop_ids)
        if eos_token_id is not None:
            stops.add(eos_token_id)
        for text in END_OF_TURN_TOKENS:
            tid = backend.token_to_id(text)
            if tid is not None and tid in self.special_token_ids and chat_template and text in chat_template:
                stops.add(tid)
        self.stop_token_ids: set[int] = {i for i in stops if 0 <= i < self.vocab_size}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, path: str | Path, reader=None) -> "Tokenizer":
        """Build the tokenizer a GGUF file describes (``tokenizer.ggml.model == "gpt2"``, byte-level BPE).

        Args:
            path: the .gguf file.
            reader: an already open ``gguf.GGUFReader`` of that file, to skip parsing it again (~3 s for
                SmolLM2: the reader walks all 49k token strings).
        Raises:
            ValueError: the file has no tokenizer, a tokenizer model other than gpt2, or a
                ``tokenizer.ggml.pre`` whose split rule is not the GPT-2 one (building it with the GPT-2 regex
                would silently give other ids than the model was trained on).
        """
        if reader is None:
            import gguf  # the gguf package: heavy import, only needed here

            reader = gguf.GGUFReader(str(path))
        model = _gguf_value(reader, "tokenizer.ggml.model")
        if model is None:
            raise ValueError(f"{path}: no tokenizer.ggml.model in the GGUF metadata")
        if model != "gpt2":
            raise ValueError(f"{path}: tokenizer.ggml.model {model!r} is not supported (supported: 'gpt2')")
        pre = _gguf_value(reader, "tokenizer.ggml.pre", "default")
        if pre not in _GPT2_SPLIT_PRE:
            raise ValueError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
                             f"(supported: {sorted(_GPT2_SPLIT_PRE)})")
        tokens: list[str] = list(_gguf_value(reader, "tokenizer.ggml.tokens"))
        types: list[int] = list(_gguf_value(reader, "tokenizer.ggml.token_type", []) or [])
        merges_raw = _gguf_value(reader, "tokenizer.ggml.merges")
        if merges_raw is None:
            raise ValueError(f"{path}: no tokenizer.ggml.merges in the GGUF metadata")

        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        speller = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)

        def spell(token: str) -> str:
            if set(token) <= alphabet:
                return token
            return "".join(piece for piece, _ in speller.pre_tokenize_str(token))

        vocab = {spell(tok): i for i, tok in enumerate(tokens)}
        merges = [tuple(m.split(" ")) for m in merges_raw]
        backend = _HFTokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                          end_of_word_suffix="", fuse_unk=False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()

        def token_of(key: str) -> int | None:
            value = _gguf_value(reader, key)
            return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

        bos, eos = token_of("tokenizer.ggml.bos_token_id"), token_of("tokenizer.ggml.eos_token_id")
        named = {i for i in (bos, eos, token_of("tokenizer.ggml.unknown_token_id"),
                             token_of("tokenizer.ggml.padding_token_id")) if i is not None}
        # Control tokens outside the byte alphabet are llama.cpp mislabels; transformers skips them, so do we.
        special = [i for i, t in enumerate(types) if t == _CONTROL and set(tokens[i]) <= alphabet]
        special += sorted(i for i in named if i not in special and set(tokens[i]) <= alphabet)
        backend.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in special])
        user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED and tokens[i] in vocab]
        if user:
            backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

        extra = [i for i in (token_of("tokenizer.ggml.eot_token_id"), token_of("tokenizer.ggml.eom_token_id"))
                 if i is not None]
        return cls(backend, bos_token_id=bos, eos_token_id=eos,
                   chat_template=_gguf_value(reader, "tokenizer.chat_template"), extra_stop_ids=extra,
                   add_bos_token=bool(_gguf_value(reader, "tokenizer.ggml.add_bos_token", False)))

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json`` of an HF-style model directory.

        Special tokens (``bos_token``/``eos_token``, strings or AddedToken dicts) and ``chat_template`` come from
        ``tokenizer_config.json``; ``chat_template.jinja`` takes precedence over the config's template (as in
        transformers). A list-of-named-templates config uses the one named "default". Without a config,
        bos/eos ids come from ``generation_config.json`` then ``config.json``; every eos id listed there is
        also a stop token.

        Raises:
            FileNotFoundError: no tokenizer.json in ``path``.
        """
        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: no such file")
        backend = _HFTokenizer.from_file(str(tok_file))
        cfg = _read_json(root / "tokenizer_config.json")
        gen = _read_json(root / "generation_config.json")
        model_cfg = _read_json(root / "config.json")

        template = cfg.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = root / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if not isinstance(template, str):
            template = None

        def resolve(name: str) -> int | None:
            text = _token_content(cfg.get(name))
            if text is not None:
                return backend.token_to_id(text)
            for source in (gen, model_cfg):
                found = _ids(source.get(f"{name}_id"))
                if found:
                    return found[0]
            return None

        extra = _ids(gen.get("eos_token_id")) + _ids(model_cfg.get("eos_token_id"))
        return cls(backend, bos_token_id=resolve("bos_token"), eos_token_id=resolve("eos_token"),
                   chat_template=template, extra_stop_ids=extra, add_bos_token=bool(cfg.get("add_bos_token", False)))

    @classmethod
    def from_path(cls, path: str | Path) -> "Tokenizer":
        """``from_dir`` for a directory, else ``from_gguf`` (a GGUF file).
        Raises: FileNotFoundError when ``path`` does not exist; as ``from_dir``/``from_gguf``."""
        p = Path(path)
        if p.is_dir():
            return cls.from_dir(p)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such file or directory")
        return cls.from_gguf(p)

    # ------------------------------------------------------------------ use
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text in it (``<|im_start|>``) becomes the special token.
        No BOS is added (chat templates write what they need)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, offsets): ``offsets[i] = (start, end)`` in characters (Python ``str`` indices) of ``text``.

        A character split over several byte-level tokens gives each of them the span of the whole character,
        so spans of consecutive tokens can overlap; ``start`` never decreases.
        """
        enc = self.backend.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; bytes that do not form valid UTF-8 become U+FFFD."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, id: int) -> str:
        """The raw vocabulary string of token ``id`` (byte-level spelling, e.g. ``"Ġthe"``).
        Raises KeyError for an id outside the vocabulary."""
        text = self.backend.id_to_token(int(id))
        if text is None:
            raise KeyError(id)
        return text

    def token_to_id(self, text: str) -> int | None:
        """The id of the vocabulary string ``text`` (raw spelling), or None."""
        return self.backend.token_to_id(text)

    def is_special(self, id: int) -> bool:
        """Whether token ``id`` is a special (control) token."""
        return id in self.special_token_ids
