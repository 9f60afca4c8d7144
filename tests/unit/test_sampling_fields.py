"""OpenAI's logit_bias and presence / frequency penalties (parsed by the protocol, applied by
ignisd.sampling.adjust_logits, checked against hand-computed logits), and the fields this server cannot honour
(structured response_format, echo, suffix, best_of > 1), which are refused naming the field instead of being ignored."""
from __future__ import annotations

import pytest
import torch

from ignis_client import protocol as P
from ignisd.request import SamplingParams
from ignisd.sampling import adjust_logits

USER = [{"role": "user", "content": "hi"}]


def _err(body: dict) -> P.ProtocolError:
    with pytest.raises(P.ProtocolError) as e:
        P.parse_request({"id": "s", **body})
    return e.value


def test_logit_bias_and_penalties_parse():
    op = P.parse_request({"id": "s", "op": "chat", "messages": USER, "logit_bias": {"50256": -100, "7": 2.5},
                          "presence_penalty": 0.5, "frequency_penalty": -2})
    s = op.sampling
    assert s.logit_bias == {50256: -100.0, 7: 2.5} and (s.presence_penalty, s.frequency_penalty) == (0.5, -2.0)
    d = P.parse_request({"id": "s", "op": "completion", "prompt": "x"}).sampling
    assert d.logit_bias == {} and d.presence_penalty == d.frequency_penalty == 0.0


@pytest.mark.parametrize("fields, code, field, words", [
    ({"logit_bias": {"x1": 1}}, "bad_request", "logit_bias.x1", 'a token id (a non-negative integer), got "x1"'),
    ({"logit_bias": {"-3": 1}}, "bad_request", "logit_bias.-3", "a key must be a token id"),
    ({"logit_bias": {"5": 101}}, "bad_request", "logit_bias.5", "must be a number in [-100, 100], got 101"),
    ({"logit_bias": {"5": True}}, "bad_request", "logit_bias.5", "got true"),
    ({"logit_bias": [1]}, "bad_request", "logit_bias", "must be an object"),
    ({"logit_bias": {str(i): 0 for i in range(1025)}}, "bad_request", "logit_bias", "at most 1024 entries, got 1025"),
    ({"presence_penalty": 2.5}, "bad_request", "presence_penalty", "must be a number in [-2, 2], got 2.5"),
    ({"frequency_penalty": "1"}, "bad_request", "frequency_penalty", 'got "1"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "model_unsupported",
     "response_format.type", "json_schema (structured output) is not supported"),
    ({"response_format": {"type": "json_object"}}, "model_unsupported", "response_format.type",
     "json_object (structured output) is not supported"),
    ({"response_format": {"type": "yaml"}}, "bad_request", "response_format.type", 'got "yaml"'),
])
def test_refusals_name_the_field(fields, code, field, words):
    e = _err({"op": "chat", "messages": USER, **fields})
    assert (e.code, e.field) == (code, field) and words in e.message, e.message
    assert e.message.startswith(f"{field}: "), e.message      # every refusal opens with the field it names


def test_text_response_format_is_what_every_reply_is():
    P.parse_request({"id": "s", "op": "chat", "messages": USER, "response_format": {"type": "text"}})


@pytest.mark.parametrize("fields, code, field", [
    ({"echo": True}, "model_unsupported", "echo"), ({"suffix": "}"}, "model_unsupported", "suffix"),
    ({"best_of": 3}, "bad_request", "best_of"),
])
def test_completion_fields_not_served_are_refused(fields, code, field):
    e = _err({"op": "completion", "prompt": "x", **fields})
    assert (e.code, e.field) == (code, field)
    P.parse_request({"id": "s", "op": "completion", "prompt": "x", "echo": False, "suffix": "", "best_of": 1})


def test_adjust_logits_by_hand():
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    plain = SamplingParams(max_tokens=1)
    assert adjust_logits(logits, plain, (3, 3)) is logits                       # nothing asked: no copy
    sp = SamplingParams(max_tokens=1, logit_bias=((0, 5.0),), presence_penalty=1.0, frequency_penalty=0.5,
                        banned_token_ids=frozenset({2}))
    # token 0: +5; token 3 generated twice: 4 − (2·0.5 + 1); token 1 once: 2 − (0.5 + 1); token 2 banned
    got = adjust_logits(logits, sp, (3, 1, 3))
    assert got.tolist() == [6.0, 0.5, float("-inf"), 2.0] and logits.tolist() == [1.0, 2.0, 3.0, 4.0]
    negative = SamplingParams(max_tokens=1, presence_penalty=-1.0)             # a negative penalty favours repeats
    assert adjust_logits(logits, negative, (0,)).tolist() == [2.0, 2.0, 3.0, 4.0]
