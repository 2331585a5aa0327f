#!/usr/bin/env python3
"""The official `openai` Python client against a running `moeflux serve`.

    tools/openai_client_test.py http://127.0.0.1:8080/v1

Chat (whole and streamed), text completions, the model list, a tool-call
round trip forced with tool_choice "required", response_format with a
JSON schema (through the client's own `parse` too) and seed
reproducibility. Written for the demo model (`tests/fixtures/demo_kjv`),
which knows only Bible text: what is checked is the shape of every answer,
not its wisdom. Prints one line per check and "N passed, N failed" last;
exits 1 if any failed. The client's version is pinned in
tools/requirements-ci.txt.
"""

import json
import sys
import traceback
from typing import Literal

import pydantic
from openai import OpenAI

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = OpenAI(base_url=BASE, api_key="none", max_retries=0, timeout=60)
MODEL = None
USER = [{"role": "user", "content": "Who made the heaven and the earth?"}]

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def models():
    global MODEL
    listed = client.models.list().data
    assert len(listed) == 1, listed
    MODEL = listed[0].id
    assert MODEL, listed


@check
def chat():
    r = client.chat.completions.create(model=MODEL, messages=USER, temperature=0, max_tokens=16)
    c = r.choices[0]
    assert c.message.role == "assistant", r
    assert isinstance(c.message.content, str) and c.message.content, r
    assert c.finish_reason in ("stop", "length"), r
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens >= 1, r.usage


@check
def chat_stream():
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    whole = client.chat.completions.create(model=MODEL, messages=USER, temperature=0, max_tokens=16)
    assert text == whole.choices[0].message.content, (text, whole)
    assert finish in ("stop", "length"), finish
    assert usage is not None and usage.completion_tokens >= 1, usage


@check
def completions():
    r = client.completions.create(model=MODEL, prompt="In the beginning", temperature=0, max_tokens=8)
    assert isinstance(r.choices[0].text, str) and r.choices[0].text, r
    stream = client.completions.create(
        model=MODEL, prompt="In the beginning", temperature=0, max_tokens=8, stream=True
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == r.choices[0].text, (text, r)


VERSE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_verse",
        "description": "Look up a verse",
        "parameters": {
            "type": "object",
            "properties": {
                "book": {"type": "string", "enum": ["Genesis", "Exodus", "John"]},
                "chapter": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["book", "chapter"],
            "additionalProperties": False,
        },
    },
}


@check
def tool_call_round_trip():
    messages = [{"role": "user", "content": "Read me the first verse of Genesis."}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[VERSE_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    assert len(c.message.tool_calls) == 1, r
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_verse", call
    args = json.loads(call.function.arguments)
    assert args["book"] in ("Genesis", "Exodus", "John"), args
    assert 1 <= args["chapter"] <= 50, args
    # Send the call and its result back; the model answers in text.
    messages.append(c.message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": "In the beginning God created the heaven and the earth."}
    )
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[VERSE_TOOL], tool_choice="none", temperature=0, max_tokens=16
    )
    assert r.choices[0].message.content, r
    assert not r.choices[0].message.tool_calls, r


SCHEMA = {
    "type": "object",
    "properties": {
        "book": {"type": "string", "enum": ["Genesis", "Exodus", "Psalms"]},
        "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
        "words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "holy": {"type": "boolean"},
    },
    "required": ["book", "chapter", "words", "holy"],
    "additionalProperties": False,
}


def valid(v):
    assert isinstance(v, dict) and set(v) == {"book", "chapter", "words", "holy"}, v
    assert v["book"] in ("Genesis", "Exodus", "Psalms"), v
    assert isinstance(v["chapter"], int) and 1 <= v["chapter"] <= 150, v
    assert isinstance(v["words"], list) and len(v["words"]) <= 3, v
    assert all(isinstance(w, str) and len(w) <= 12 for w in v["words"]), v
    assert isinstance(v["holy"], bool), v


@check
def response_format_json_schema():
    fmt = {"type": "json_schema", "json_schema": {"name": "verse", "schema": SCHEMA, "strict": True}}
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model=MODEL, messages=USER, response_format=fmt, temperature=1, seed=seed, max_tokens=120
        )
        assert r.choices[0].finish_reason == "stop", r
        valid(json.loads(r.choices[0].message.content))


class Verse(pydantic.BaseModel):
    book: Literal["Genesis", "Exodus"]
    chapter: int = pydantic.Field(ge=1, le=150)
    first_word: str = pydantic.Field(max_length=12)
    holy: bool


@check
def response_format_parse():
    r = client.chat.completions.parse(
        model=MODEL, messages=USER, response_format=Verse, temperature=0, max_tokens=120
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Verse), r
    assert 1 <= parsed.chapter <= 150 and len(parsed.first_word) <= 12, parsed


@check
def json_schema_errors_are_400():
    import openai

    try:
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}},
        )
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "response_format", e.body
    else:
        raise AssertionError("an invalid schema was accepted")


@check
def logprobs():
    r = client.chat.completions.create(
        model=MODEL, messages=USER, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, r
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content), content


@check
def seed_reproducibility():
    def once(seed):
        r = client.chat.completions.create(model=MODEL, messages=USER, temperature=1, seed=seed, max_tokens=24)
        return r.choices[0].message.content

    a, b = once(42), once(42)
    assert a == b, (a, b)
    others = {once(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds all gave the same text"


def main():
    passed = failed = 0
    for fn in CHECKS:
        try:
            fn()
            passed += 1
            print(f"ok    {fn.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL  {fn.__name__}")
            traceback.print_exc()
    print(f"openai: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
