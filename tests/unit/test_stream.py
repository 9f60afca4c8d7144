"""StreamDecoder: real SmolLM2 token ids fed one at a time; pieces never split a UTF-8 character and never run
past a stop string. Expected pieces are written by hand from the tokens' UTF-8 bytes."""
from __future__ import annotations

import random

import pytest

from ignisd.text.stream import StreamDecoder
from text_corpus import corpus, ignis_smollm_tokenizer


@pytest.fixture(scope="module")
def tok():
    return ignis_smollm_tokenizer()


def feed(tok, ids, stop=(), skip=True):
    dec = StreamDecoder(tok, list(stop), skip_special_tokens=skip)
    pieces = [dec.push(i) for i in ids]
    return dec, pieces, dec.flush()


def test_cyrillic_pieces_wait_for_whole_characters(tok):
    text = "Привет, мир! Как дела?"
    ids = tok.encode(text)
    # "П" (D0 9F) and "К" (D0 9A) are each split over two byte-level tokens: nothing is sent for the first half.
    assert [tok.decode([i]) for i in ids[:2]] == ["\ufffd", "\ufffd"]
    dec, pieces, tail = feed(tok, ids)
    assert pieces == ["", "П", "ри", "в", "ет", ",", " м", "и", "р", "!", "", " К", "а", "к", " д", "ел", "а", "?"]
    assert tail == "" and dec.text == text and not dec.stopped


def test_emoji_and_cjk_pieces(tok):
    text = "日本🇯🇵のラーメン🍜 👨‍👩‍👧‍👦 é"
    ids = tok.encode(text)
    dec, pieces, tail = feed(tok, ids)
    assert [p for p in pieces if p] == ["日", "本", "🇯", "🇵", "の", "ラ", "ー", "メ", "ン", "🍜", " 👨", "\u200d",
                                        "👩", "\u200d", "👧", "\u200d", "👦", " é"]
    assert dec.text + tail == text == tok.decode(ids)


def test_corpus_concatenation_equals_decode(tok):
    for text in corpus():
        ids = tok.encode(text)
        for skip in (True, False):
            dec, pieces, tail = feed(tok, ids, skip=skip)
            assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip) == dec.text
            assert not any("\ufffd" in p for p in pieces + [tail]), text


def test_special_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert [tok.token_text(i) for i in ids] == ["<|im_start|>", "ass", "istant", "Ċ", "Hi", "<|im_end|>"]
    dec, pieces, tail = feed(tok, ids)
    assert pieces == ["", "ass", "istant", "\n", "Hi", ""] and dec.text == "assistant\nHi"
    dec, pieces, tail = feed(tok, ids, skip=False)
    assert pieces == ["<|im_start|>", "ass", "istant", "\n", "Hi", "<|im_end|>"]


def test_stop_string_spanning_tokens(tok):
    ids = tok.encode("The capital of France is Paris.")
    assert [tok.decode([i]) for i in ids] == ["The", " capital", " of", " France", " is", " Paris", "."]
    dec, pieces, tail = feed(tok, ids, stop=["is Par"])
    # " is" could start "is Par": " " goes out, "is" waits; " Paris" completes the stop string.
    assert pieces == ["The", " capital", " of", " France", " ", "", ""]
    assert tail == "" and dec.stopped and dec.text == "The capital of France "
    assert dec.push(ids[0]) == "" and dec.flush() == ""


def test_stop_string_inside_one_token(tok):
    ids = tok.encode("The capital of France is Paris.")
    dec, pieces, tail = feed(tok, ids, stop=[" Par"])
    assert pieces == ["The", " capital", " of", " France", " is", "", ""] and dec.text == "The capital of France is"


def test_earliest_stop_string_wins(tok):
    dec, _, _ = feed(tok, tok.encode("The capital of France is Paris."), stop=["Paris", "capital"])
    assert dec.stopped and dec.text == "The "
    dec, pieces, _ = feed(tok, tok.encode("The capital of France is Paris."), stop=["The"])
    assert dec.stopped and dec.text == "" and pieces[0] == ""


def test_stop_string_over_split_characters(tok):
    ids = tok.encode("Привет, мир! Как дела?")
    dec, pieces, tail = feed(tok, ids, stop=["мир! К"])
    assert dec.stopped and dec.text == "Привет, " and "".join(pieces) + tail == "Привет, "


def test_held_prefix_released_when_stop_does_not_complete(tok):
    ids = tok.encode("I say ab and then abd.")
    dec, pieces, tail = feed(tok, ids, stop=["abc"])
    assert pieces == ["I", " say", " ", "ab and", " then", " abd", "."]
    assert not dec.stopped and dec.text == "I say ab and then abd."


def test_flush_releases_a_held_stop_prefix(tok):
    ids = tok.encode("The capital of France is")
    dec, pieces, tail = feed(tok, ids, stop=["is Par"])
    assert pieces[-1] == " " and tail == "is" and not dec.stopped
    assert dec.text == "The capital of France is"


def test_flush_emits_an_incomplete_last_character_like_decode(tok):
    ids = tok.encode("ok 😀")
    # "😀" is F0 9F 98 80: the tokens are "ok", " " + F0 9F 98, and 80
    assert [tok.token_text(i) for i in ids] == ["ok", "ĠðŁĺ", "Ģ"]
    dec, pieces, tail = feed(tok, ids[:-1])  # generation ended inside the emoji
    assert pieces == ["ok", ""] and tail == " \ufffd"  # one U+FFFD for the incomplete sequence
    assert dec.text == "ok \ufffd" == tok.decode(ids[:-1])


def test_random_stop_strings_cut_exactly(tok):
    rng = random.Random(0)
    texts = [t for t in corpus() if len(t) > 8]
    for _ in range(300):
        text = rng.choice(texts)
        a = rng.randrange(len(text) - 4)
        stop = text[a:a + rng.randint(1, 6)]
        other = "\x00never"  # a second stop string that never appears
        dec, pieces, tail = feed(tok, tok.encode(text), stop=[other, stop], skip=False)
        assert dec.stopped
        assert dec.text == "".join(pieces) + tail == text[:text.find(stop)], (text, stop)
