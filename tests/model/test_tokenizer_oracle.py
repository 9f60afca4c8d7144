"""Tokenizer oracle: our tokenizer (built with `tokenizers` from the GGUF metadata) against transformers'
tokenizer loaded from the same GGUF, on a corpus of real text; and `from_dir` against transformers on the same
tokenizer.json."""
from __future__ import annotations

import json
import os

import pytest

from text_corpus import QWEN35_DIR, corpus, hf_smollm_tokenizer, ignis_smollm_tokenizer

CORPUS = corpus()


@pytest.fixture(scope="module")
def ours():
    return ignis_smollm_tokenizer()


@pytest.fixture(scope="module")
def hf():
    return hf_smollm_tokenizer()


def test_corpus_is_big_and_varied():
    assert len(CORPUS) >= 200
    scripts = {"Cyrillic": "\u0400", "Greek": "\u0370", "CJK": "\u4e00", "Arabic": "\u0600",
               "Devanagari": "\u0900", "Hangul": "\uac00"}
    for name, lo in scripts.items():
        span = range(ord(lo), ord(lo) + (0x2000 if name in ("CJK", "Hangul") else 0x100))
        assert any(any(ord(c) in span for c in s) for s in CORPUS), name
    assert any(ord(c) >= 0x1F300 for s in CORPUS for c in s)  # emoji
    assert any("<|im_start|>" in s for s in CORPUS)


def test_metadata(ours, hf):
    assert ours.vocab_size == 49152 == len(hf)
    assert (ours.bos_token_id, ours.bos_token) == (1, "<|im_start|>") == (hf.bos_token_id, hf.bos_token)
    assert (ours.eos_token_id, ours.eos_token) == (2, "<|im_end|>") == (hf.eos_token_id, hf.eos_token)
    assert ours.stop_token_ids == {2}
    assert ours.special_token_ids == frozenset(range(17))  # the 17 CONTROL tokens of the GGUF
    assert ours.add_bos_token is False
    assert ours.chat_template == hf.chat_template
    assert ours.token_text(1) == "<|im_start|>"
    assert ours.token_text(19556) == hf.convert_ids_to_tokens(19556)
    assert ours.token_to_id("Ġthe") == hf.convert_tokens_to_ids("Ġthe")


def test_ids_equal_transformers(ours, hf):
    mismatches = []
    for s in CORPUS:
        expected = hf(s)["input_ids"]
        got = ours.encode(s)
        if got != expected:
            mismatches.append((s, got, expected))
    assert not mismatches, f"{len(mismatches)} strings differ, first: {mismatches[0]}"


def test_special_token_text_becomes_one_token(ours):
    # hand-checked: 1 = <|im_start|>, 2 = <|im_end|>, 198 = "\n"
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 1 and ids[-2:] == [2, 198]
    assert ours.encode("<|im_start|>") == [1]


def test_offsets_equal_transformers_and_reassemble(ours, hf):
    for s in CORPUS:
        ids, offsets = ours.encode_with_offsets(s)
        assert offsets == [tuple(o) for o in hf(s, return_offsets_mapping=True)["offset_mapping"]], s
        assert len(ids) == len(offsets)
        covered, pieces = 0, []
        for start, end in offsets:
            assert 0 <= start <= end <= len(s)
            assert start <= covered  # no gap; overlap only where a character spans several byte tokens
            pieces.append(s[max(start, covered):end])
            covered = max(covered, end)
        assert "".join(pieces) == s


def test_offsets_of_a_split_character(ours):
    # "😀" is 4 UTF-8 bytes that the vocabulary splits over tokens: each gets the whole character's span.
    s = "ok 😀!"
    ids, offsets = ours.encode_with_offsets(s)
    assert offsets[0] == (0, 2)
    emoji_spans = [o for o in offsets if o[1] == 4]
    assert len(emoji_spans) >= 2 and all(o[0] in (2, 3) for o in emoji_spans)
    assert offsets[-1] == (4, 5)


def test_decode_round_trips(ours, hf):
    for s in CORPUS:
        ids = ours.encode(s)
        assert ours.decode(ids) == s == hf.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_decode_skips_special_tokens(ours):
    ids = ours.encode("<|im_start|>assistant\nParis.<|im_end|><|endoftext|>")
    assert ours.decode(ids, skip_special_tokens=True) == "assistant\nParis."


def test_from_dir_equals_transformers_on_qwen35_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "chat_template.jinja"):
        os.symlink(QWEN35_DIR / name, tmp_path / name)
    hf_q = AutoTokenizer.from_pretrained(str(tmp_path))
    from ignisd.text.tokenizer import Tokenizer

    q = Tokenizer.from_dir(tmp_path)
    assert q.vocab_size == len(hf_q)
    assert q.chat_template == (QWEN35_DIR / "chat_template.jinja").read_text()
    im_end = q.token_to_id("<|im_end|>")
    assert im_end is not None and q.stop_token_ids == {im_end}  # no config: the template's end-of-turn token
    for s in CORPUS[::3]:
        ids = q.encode(s)
        assert ids == hf_q(s)["input_ids"], s
        assert q.decode(ids) == hf_q.decode(ids)


def test_from_dir_reads_tokenizer_config(tmp_path, ours):
    ours.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>", "special": True}, "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": "{{ messages[0]['content'] }}<|im_end|>"},
                          {"name": "tool_use", "template": "x"}],
        "add_bos_token": False}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    from ignisd.text.tokenizer import Tokenizer

    t = Tokenizer.from_dir(tmp_path)
    assert (t.bos_token_id, t.eos_token_id) == (1, 2)
    assert t.chat_template == "{{ messages[0]['content'] }}<|im_end|>"
    assert t.stop_token_ids == {0, 2}
    assert t.encode(CORPUS[5]) == ours.encode(CORPUS[5])
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}")
    assert Tokenizer.from_dir(tmp_path).chat_template == "{{ bos_token }}"


def test_from_path_dispatches(tmp_path, ours):
    from ignisd.text.tokenizer import Tokenizer
    from text_corpus import smollm_gguf_path

    ours.backend.save(str(tmp_path / "tokenizer.json"))
    assert Tokenizer.from_path(tmp_path).encode("héllo wörld") == ours.encode("héllo wörld")
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_path(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf(smollm_gguf_path(), reader=_FakeReader({"tokenizer.ggml.model": "llama"}))
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'qwen2'"):
        Tokenizer.from_gguf(smollm_gguf_path(),
                            reader=_FakeReader({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"}))


class _FakeReader:
    """Just enough of gguf.GGUFReader for the refusal paths."""

    class _Field:
        def __init__(self, value):
            self.value = value

        def contents(self):
            return self.value

    def __init__(self, values: dict):
        self.fields = {k: self._Field(v) for k, v in values.items()}
