"""The passkey bench's answer margin (tools/kvformat_passkey.answer_margin) on hand-made logits."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from kvformat_passkey import answer_margin  # noqa: E402


def test_margin_is_the_smallest_lead_of_the_answer_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.5],       # answer 1: leads 2.5 by 0.5
                           [4.0, 1.0, 5.5, 0.0]])      # answer 2: leads 4.0 by 1.5
    assert answer_margin(logits, [1, 2]) == 0.5


def test_a_miss_has_a_negative_margin():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.5],
                           [4.0, 1.0, 3.25, 0.0]])     # answer 2 trails 4.0 by 0.75
    assert answer_margin(logits, [1, 2]) == -0.75
    assert logits.argmax(-1).tolist() != [1, 2]


def test_a_repeated_answer_token_is_masked_only_in_its_own_row():
    logits = torch.tensor([[2.0, 1.0], [2.0, 1.0]])
    assert answer_margin(logits, [0, 1]) == -1.0          # row 1's answer (1) trails token 0 by 1
