"""Prompt files of workloads: what is read, and every refusal naming its line and field."""
import json

import pytest

from engine.workload import prompts
from engine.workload.prompts import PromptFileError, parse_prompts, read_prompts


def lines(*entries) -> bytes:
    return "\n".join(e if isinstance(e, str) else json.dumps(e) for e in entries).encode()


def test_json_lines_with_ids_categories_and_conversations():
    data = lines({"prompt": "the cat", "id": "r1", "category": "animals"}, "",
                 {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a dog"}]},
                 {"prompt": "x", "id": 7})
    got = parse_prompts(data, "p.jsonl")
    assert [(r.line, r.id, r.category) for r in got] == [(1, "r1", "animals"), (3, "line-3", "uncategorised"),
                                                         (4, "7", "uncategorised")]
    assert got[0].text == "the cat" and got[1].prompt is None
    assert got[1].messages == (("system", "be brief"), ("user", "a dog"))
    assert got[1].text == "system: be brief\nuser: a dog"  # what a model without a chat template reads


def test_plain_text_is_one_prompt_a_line():
    got = parse_prompts(b"first prompt\r\n\nsecond {not json}\n", "p.txt")
    assert [(r.line, r.id, r.prompt) for r in got] == [(1, "line-1", "first prompt"), (3, "line-3", "second {not json}")]


def test_fingerprint_changes_with_what_is_asked():
    a, b, c = parse_prompts(lines({"prompt": "x", "id": "1"}, {"prompt": "y", "id": "2"},
                                  {"prompt": "x", "id": "3", "category": "c"}), "p")
    assert len({a.fingerprint(), b.fingerprint(), c.fingerprint()}) == 3
    assert a.fingerprint() == parse_prompts(lines({"prompt": "x", "id": "1"}), "q")[0].fingerprint()


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "a"}\n{"prompt": "b"', "p.jsonl line 2: malformed JSON"),
    ('{"prompt": NaN}', "p.jsonl line 1: malformed JSON (NaN is not JSON)"),
    ('{"prompt": "   "}', "p.jsonl line 1: field 'prompt': the prompt is empty"),
    ('{"prompt": 3}', "line 1: field 'prompt': must be a string, not int"),
    ('{"prompt": "a", "temperature": 0}', "line 1: unknown key 'temperature'"),
    ('{"prompt": "a", "messages": []}', "line 1: give exactly one of"),
    ('{"id": "a"}', "line 1: give exactly one of"),
    ('["a"]', "line 1: a request is a JSON object"),
    ('{"prompt": "a", "id": ""}', "line 1: field 'id' must be a non-empty string"),
    ('{"prompt": "a", "id": "x\\ny"}', "line 1: field 'id' must be printable text"),
    ('{"prompt": "a", "category": true}', "line 1: field 'category' must be a non-empty string"),
    ('{"messages": "hi"}', "line 1: field 'messages': must be a list"),
    ('{"messages": [{"role": "user"}]}', "field 'messages'[0]: a turn is"),
    ('{"messages": [{"role": "robot", "content": "a"}]}', "field 'messages'[0].role: one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
     "the last turn must be the user's"),
    ('{"messages": [{"role": "user", "content": ""}]}', "field 'messages[0].content': the prompt is empty"),
    ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}', "line 2: field 'id': 'x' is already the id of line 1"),
    ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", "line 1: malformed JSON"),
])
def test_bad_lines_are_refused_by_line_and_field(bad, message):
    with pytest.raises(PromptFileError) as err:
        parse_prompts(bad.encode(), "p.jsonl")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_not_utf8_and_blank_files_are_refused():
    with pytest.raises(PromptFileError, match="line 2: not UTF-8"):
        parse_prompts(b"ok\n\xff\xfe", "p.txt")
    with pytest.raises(PromptFileError, match="no requests"):
        parse_prompts(b"\n  \n", "p.txt")


def test_more_than_the_stated_requests_or_bytes_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(prompts, "MAX_REQUESTS", 3)
    with pytest.raises(PromptFileError, match="4 requests; a workload holds at most 3"):
        parse_prompts(b"a\nb\nc\nd\n", "p.txt")
    monkeypatch.setattr(prompts, "MAX_FILE_BYTES", 10)
    big = tmp_path / "big.txt"
    big.write_text("a prompt longer than ten bytes\n")
    with pytest.raises(PromptFileError, match="at most 10 are read"):
        read_prompts(big)
    with pytest.raises(PromptFileError, match="no such file"):
        read_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("line, field", [
    ('{"prompt": "a \\ud800 b"}', "'prompt'"),
    ('{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "\\udfff"}]}',
     "'messages[1].content'"),
    ('{"prompt": "a", "id": "r\\ud83d"}', "'id'"),
    ('{"prompt": "a", "category": "\\udc00cat"}', "'category'"),
])
def test_a_lone_surrogate_is_refused_by_the_parser_naming_file_line_and_field(tmp_path, line, field):
    # Valid JSON, but no text: it could not be written as UTF-8 once the models had loaded.
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n' + line.encode())
    with pytest.raises(PromptFileError) as err:
        read_prompts(path)
    assert f"p.jsonl line 2: field {field}" in str(err.value) and "surrogate" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_surrogate_pair_is_one_character_and_is_read():
    got = parse_prompts(lines('{"prompt": "a \\ud83d\\ude00", "id": "smile-\\ud83d\\ude00"}'), "p.jsonl")
    assert got[0].prompt == "a \U0001F600" and got[0].id == "smile-\U0001F600"
    got[0].fingerprint()  # writable as UTF-8
