import pytest

from eagle3_plugin.datafiles import read_prompts, read_training_data
from eagle3_plugin.errors import Eagle3Error


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_prompt_format(tmp_path):
    path = write(tmp_path, "q.jsonl", "\n".join([
        '{"question_id": 1, "category": "coding", "turns": ["first turn", "second turn"]}',
        '{"task_id": "HumanEval/0", "prompt": "def f():"}',
        '{"question": "How many?", "answer": "4"}',
        '{"instruction": "Name three actors."}',
        "",
    ]))
    records = read_prompts(path)
    assert [r.prompt for r in records] == ["first turn", "def f():", "How many?", "Name three actors."]
    assert records[0].category == "coding" and records[1].category is None
    assert [r.prompt for r in read_prompts(write(tmp_path, "p.txt", "one\n\ntwo\n"))] == ["one", "two"]


def test_training_formats(tmp_path):
    docs = read_training_data(write(tmp_path, "d.txt", "doc one\nline\n\n\ndoc two\n"))
    assert [d.text for d in docs] == ["doc one\nline", "doc two"]
    recs = read_training_data(write(tmp_path, "d.jsonl", '{"prompt": "p", "response": "r"}\n{"text": "t"}\n'))
    assert (recs[0].prompt, recs[0].response, recs[1].text) == ("p", "r", "t")


@pytest.mark.parametrize("line, message", [
    ("{not json", r"bad.jsonl:2: not valid JSON"),
    ("[1, 2]", r"bad.jsonl:2: expected a JSON object"),
    ('{"turns": []}', r"bad.jsonl:2: 'turns' must be a non-empty list"),
    ('{"turns": "hi"}', r"bad.jsonl:2: 'turns' must be a non-empty list"),
    ('{"id": 3}', r"bad.jsonl:2: no prompt field"),
    ('{"prompt": ""}', r"bad.jsonl:2: 'prompt' must be a non-empty string"),
    ('{"prompt": "x", "category": 5}', r"bad.jsonl:2: 'category' must be a string"),
])
def test_malformed_records_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "bad.jsonl", '{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(Eagle3Error, match=message):
        read_prompts(path)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(Eagle3Error, match="no such file"):
        read_prompts(str(tmp_path / "none.jsonl"))
    with pytest.raises(Eagle3Error, match="no prompts found"):
        read_prompts(write(tmp_path, "empty.txt", "\n\n"))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(Eagle3Error, match="not UTF-8"):
        read_prompts(str(binary))
