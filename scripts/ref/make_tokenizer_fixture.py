#!/usr/bin/env python3
"""make_tokenizer_fixture.py - builds tests/fixtures/tokenizer_corpus.jsonl,
the reference token ids zinfer's tokenizer must reproduce.

It generates a deterministic (seeded) corpus of varied strings - prose in
many scripts, code, numbers, whitespace runs, emoji, contractions, combining
marks, chat markup and special-token text, codepoints new in recent Unicode
versions - and records, for each, the ids llama.cpp produces for the default
model through llama-cpp-python:

    Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False,
                                                special=False / True)

One JSON object per line: {"text": ..., "plain": [...], "special": [...]}.
llama.cpp is the arbiter; rerun this script (with the venv that has
llama-cpp-python) when the reference or the corpus changes:

    /root/.cache/zinfer/venv/bin/python scripts/ref/make_tokenizer_fixture.py \
        [--model PATH] [--out tests/fixtures/tokenizer_corpus.jsonl] [--count N]
"""
import argparse
import json
import os
import random
import sys

DEFAULT_MODEL = '/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf'

PROSE = {
    'en': ["The quick brown fox jumps over the lazy dog.",
           "It's a truth universally acknowledged that servers need caches.",
           "We've shipped 3 releases this year; they'll ship 2 more.",
           "Don't panic! Read the manual, then ask: \"why?\"",
           "I'M SHOUTING and I'LL keep doing it, she'D said."],
    'fr': ["Le cœur a ses raisons que la raison ne connaît point.",
           "À l'été, nous irons à Montréal — c'est décidé !",
           "Où est la bibliothèque ? Elle est fermée jusqu'à lundi."],
    'de': ["Größere Übungen für Bäckerinnen in Köln sind schön.",
           "Die Straße heißt „Am Ölberg“ und ist 1,5 km lang.",
           "Äpfel, Öl und Übermut: das ist süß."],
    'ru': ["Съешь же ещё этих мягких французских булок, да выпей чаю.",
           "Москва — столица России; население около 13 млн человек.",
           "Привет, мир! Как дела?"],
    'el': ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
           "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
           "Γειά σου Κόσμε!"],
    'zh': ["我们在北京的服务器上部署了一个大型语言模型。",
           "今天天气很好，我们去公园散步吧！",
           "中文分词没有空格，所以整句会成为一个片段。"],
    'ja': ["東京は日本の首都です。ひらがなとカタカナと漢字を使います。",
           "トークナイザーのテストをしています。",
           "吾輩は猫である。名前はまだ無い。"],
    'ko': ["안녕하세요, 세계! 한국어 문장을 토큰화합니다.",
           "서울은 대한민국의 수도입니다."],
    'ar': ["مرحبا بالعالم! هذه جملة باللغة العربية.",
           "القاهرة هي عاصمة مصر وعدد سكانها ٢٠ مليون."],
    'he': ["שלום עולם! זהו משפט בעברית.",
           "ירושלים היא עיר עתיקה."],
    'hi': ["नमस्ते दुनिया! यह हिंदी में एक वाक्य है।",
           "भारत की राजधानी नई दिल्ली है, जनसंख्या १४० करोड़।"],
    'th': ["สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
           "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย"],
}

CODE = [
    '#include <stdio.h>\n\nint main(void) {\n    printf("hello, %s\\n", "world");\n    return 0;\n}\n',
    'static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }',
    'for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}',
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
    'class Foo(Base):\n    def __init__(self, **kw):\n        super().__init__(**kw)  # TODO\n',
    'print(f"{x!r:>10} {y:.3f}")\nlambda s: s.strip().split(",")',
    '{"id": 12345, "name": "zinfer", "tags": ["llm", "c11"], "ratio": 0.75, "ok": true, "none": null}',
    '[{"a": [1, 2, {"b": "c"}]}, {"\\u00e9": "\\n"}]',
    '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>Test &amp; more</title></head>\n<body><p class="x">Hi</p></body>\n</html>',
    '<a href="https://example.com/path?q=1&r=2#frag">link</a>',
    'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%son\' ORDER BY id DESC;',
    'fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!("{:?}", v); }',
    '$ ls -la /usr/local/bin | grep -E "^d" && echo "done" >> /tmp/log.txt 2>&1',
    'x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&=e|f^g;',
]

SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<repo_name>', '<reponame>',
            '<file_sep>', '<filename>', '<gh_stars>', '<issue_start>', '<issue_comment>',
            '<issue_closed>', '<jupyter_start>', '<jupyter_text>', '<jupyter_code>',
            '<jupyter_output>', '<jupyter_script>', '<empty_output>']

EMOJI = ['😀', '😂', '🦙', '🚀', '❤️', '👍', '👍🏻', '👍🏽', '👍🏿', '👨‍👩‍👧‍👦', '👩‍💻', '🏳️‍🌈',
         '🇫🇷', '🇯🇵', '✨', '🤖', '☕', '1️⃣', '#️⃣', '🫠', '🪿']

NUMBERS = ['0', '7', '42', '2024', '1,234,567', '3.14159', '-0.5', '1e-9', '6.022e23',
           '2024-05-09', '12:34:56', '1/2', '½', '¼', '¾', '⅓', 'x²', 'y³', 'H₂O', '10⁻⁶',
           '٠١٢٣٤٥٦٧٨٩', '۱۲۳', '०१२३४५', '１２３', 'Ⅻ', 'ⅷ', '①②③', '๑๒๓', '𝟙𝟚𝟛',
           '$1,000.00', '€9,99', '100%', '#1', 'v1.2.3', '0x1F', '0b1010', '1_000_000']

WS = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\r\n', '\r\n\r\n', ' \n', '\n ',
      '\u00a0', '\u3000', '\u2003', '\u2028', '\u0085', '\x0b', '\x0c']

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL",
                "'D", "’s", "'x", "''", "'"]

COMBINING = ['e\u0301', 'a\u0300', 'n\u0303', 'o\u0308', 'A\u030a', 'c\u0327',
             'Z\u0335\u0321\u0356', 'ก\u0e34\u0e4a', 'क\u094d\u0937', '\u05e9\u05c1\u05b8',
             'q\u0307\u0323', '\u0301', '\u20dd']

# Codepoints assigned in Unicode 15.0/15.1 (llama.cpp's tables know them),
# unassigned ones, private use, format and control characters.
EXOTIC = ['\U0001FAE8', '\U0001FA75', '\U00031350', '\U0002EBF0', '\U00011F00', '\U0001E4D0',
          '\u0cf3', '\U0001D2C0', '\u0378', '\U000E01F0', '\uE000', '\U000F0000', '\ufeff',
          '\u200b', '\u200d', '\u2060', '\u00ad', '\x01', '\x1b', '\x7f', '\u0600', '\ufffd',
          '\U0001F3FB', '\u2062', '\U0010FFFD', '\ufdd0', '\uffff']

FIXED = [
    '', ' ', '  ', '\n', '\t', '\r\n', 'a', 'Hello world', 'Hello, world!', ' Hello',
    'Hello ', '  Hello  ', 'hello\n\nworld', 'a  b', 'a  1', 'a 1', '1 a', 'x1y2z3',
    '<|im_start|>user\nhi<|im_end|>', '<|im_start|>system\nYou are a helpful AI assistant '
    'named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n'
    '<|im_start|>assistant\n', '<|endoftext|>', '<|endoftext|><|endoftext|>', '<|im_',
    '<|im_end', 'im_end|>', '<|im_start|', '<<|im_start|>>', '<|im_start|><|im_end|>',
    ' <|im_start|> ', '<|endoftext|>text', 'text<|endoftext|>', '<reponame>zinfer<file_sep>',
    "I'm", "I'M", "you'RE", "they'll", "THEY'LL", "it's", "IT'S", "she'd", "we've",
    "'s", "'", "''s", " 's", "''", "don't", "rock'n'roll", "l'été", "'ll've'd",
    'naïve café', 'Ελληνικά', '日本語', '한국어', 'العربية', 'עברית', 'हिन्दी', 'ภาษาไทย',
    '😀', '👨‍👩‍👧', '👍🏽', 'a😀b', '😀😀😀', '½²³', '١٢٣', '12345', '3.14', '1,234,567',
    '    ', '\t\t\t', '\n\n\n', ' \t \n ', 'x    ', '    x', 'x    y', 'x\t\ty', 'x\n\ny',
    'e\u0301', '\u0301', 'x\u00a0y', '\u3000x', 'x\u2028y', 'x\u0085y',
]


def rand_prose(r):
    lang = r.choice(sorted(PROSE))
    s = r.choice(PROSE[lang])
    mode = r.randrange(4)
    if mode == 0:
        return s
    if mode == 1:  # a slice of it
        a = r.randrange(len(s))
        b = r.randrange(a, len(s) + 1)
        return s[a:b]
    if mode == 2:  # two languages mixed
        return s + r.choice(WS) + r.choice(PROSE[r.choice(sorted(PROSE))])
    words = s.split(' ')
    r.shuffle(words)
    return ' '.join(words)


def rand_numbers(r):
    parts = []
    for _ in range(r.randint(1, 5)):
        k = r.randrange(5)
        if k == 0:
            parts.append(r.choice(NUMBERS))
        elif k == 1:
            parts.append(str(r.randint(0, 10 ** r.randint(1, 12))))
        elif k == 2:
            parts.append('%.*f' % (r.randint(1, 6), r.uniform(-1e4, 1e4)))
        elif k == 3:
            parts.append('{:,}'.format(r.randint(1000, 10 ** 10)))
        else:
            parts.append('%04d-%02d-%02d' % (r.randint(1900, 2100), r.randint(1, 12),
                                             r.randint(1, 28)))
    seps = [' ', '', ', ', ' and ', '\n', 'x', '-', '/']
    return ''.join(p + r.choice(seps) for p in parts).rstrip()


def rand_ws(r):
    out = []
    for _ in range(r.randint(1, 8)):
        if r.random() < 0.5:
            out.append(''.join(r.choice(WS) for _ in range(r.randint(1, 4))))
        else:
            out.append(r.choice(['word', 'x', 'Hello', 'déjà', '中文', '42', '!', '😀', '#']))
    return ''.join(out)


def rand_soup(r):
    pools = [WS, CONTRACTIONS, COMBINING, EXOTIC, EMOJI, NUMBERS, SPECIALS,
             ['a', 'Z', 'é', 'ß', 'Ж', 'λ', '中', 'ア', '한', 'ع', 'ש', 'क', 'ไ', '!', '?', '...',
              '<', '>', '<|', '|>', '<|im_', '$', '€', '+', '=', '{', '}', '\\', '_', '-', '"']]
    return ''.join(r.choice(r.choice(pools)) for _ in range(r.randint(1, 16)))


def rand_chat(r):
    msgs = []
    for _ in range(r.randint(1, 3)):
        role = r.choice(['system', 'user', 'assistant'])
        body = rand_prose(r) if r.random() < 0.7 else r.choice(CODE)
        msgs.append('<|im_start|>%s\n%s<|im_end|>\n' % (role, body))
    if r.random() < 0.5:
        msgs.append('<|im_start|>assistant\n')
    if r.random() < 0.2:
        msgs.append(r.choice(['<|im_', '<|endoftext|>', '<|im_end', '|>']))
    return ''.join(msgs)


def rand_code(r):
    s = r.choice(CODE)
    if r.random() < 0.5:
        return s
    a = r.randrange(len(s))
    return s[a:a + r.randint(1, 80)]


def rand_emoji(r):
    return ''.join(r.choice(EMOJI + [' ', '', 'ok', '!']) for _ in range(r.randint(1, 8)))


def rand_contraction(r):
    words = ['it', 'IT', 'they', 'We', "don", 'you', 'John', 'x', '']
    return ' '.join(r.choice(words) + r.choice(CONTRACTIONS) for _ in range(r.randint(1, 5)))


def rand_long(r):
    parts = [rand_prose(r), rand_code(r), rand_numbers(r), rand_ws(r), rand_emoji(r)]
    out = []
    for _ in range(r.randint(5, 20)):
        out.append(r.choice(parts))
        out.append(r.choice([' ', '\n', '\n\n', '', '  ']))
    return ''.join(out)


GENERATORS = [(rand_prose, 30), (rand_numbers, 12), (rand_ws, 10), (rand_soup, 14),
              (rand_chat, 8), (rand_code, 10), (rand_emoji, 6), (rand_contraction, 6),
              (rand_long, 2)]


def make_corpus(count, seed):
    r = random.Random(seed)
    texts = list(FIXED)
    texts += [s for lang in sorted(PROSE) for s in PROSE[lang]]
    texts += CODE + SPECIALS + EMOJI + NUMBERS + COMBINING + EXOTIC
    fns = [f for f, w in GENERATORS for _ in range(w)]
    seen = set(texts)
    while len(texts) < count:
        s = r.choice(fns)(r)
        if '\x00' in s or s in seen:
            continue
        seen.add(s)
        texts.append(s)
    return texts


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, '..', '..'))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=os.environ.get('ZINFER_MODEL', DEFAULT_MODEL))
    ap.add_argument('--out', default=os.path.join(root, 'tests', 'fixtures',
                                                  'tokenizer_corpus.jsonl'))
    ap.add_argument('--count', type=int, default=2500)
    ap.add_argument('--seed', type=int, default=20240509)
    args = ap.parse_args()

    import llama_cpp
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    texts = make_corpus(args.count, args.seed)
    with open(args.out, 'w', encoding='utf-8') as f:
        for t in texts:
            b = t.encode('utf-8')
            rec = {'text': t,
                   'plain': llm.tokenize(b, add_bos=False, special=False),
                   'special': llm.tokenize(b, add_bos=False, special=True)}
            f.write(json.dumps(rec, ensure_ascii=False) + '\n')
    print('wrote %s: %d strings, %d bytes' % (args.out, len(texts), os.path.getsize(args.out)),
          file=sys.stderr)


if __name__ == '__main__':
    main()
