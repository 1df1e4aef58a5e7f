"""Datasets, exact prompt lengths and a local tokenizer for `dsctl probe` (--dataset, --tokenizer)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dsctl.adapters.tokenizer import LocalTokenizer
from dsctl.core.load import dataset
from dsctl.core.load.tokens import count_tokens
from dsctl.core.load.workload import WORDS, LengthSpec, Workload, engine_tokens, fit_words
from dsctl.errors import UsageError
from dsctl.services.probe import ProbeConfig, make_plan, read_dataset

from .tokenizers_offline import byte_bpe, word_level

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "hello there world"},
                                  {"from": "gpt", "value": "the quick brown fox, jumps"},
                                  {"from": "human", "value": "more"}, {"from": "gpt", "value": "ignored"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "be brief"}, {"from": "user", "value": "why"},
                                  {"from": "assistant", "value": "because"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "no answer"}]},
    {"id": "d"},
]


# -- exact prompt lengths -----------------------------------------------------------------------------------


def test_synthetic_prompts_are_exactly_n_tokens_under_the_engine_rule():
    assert all(len(w) <= 8 for w in WORDS)  # the engine counts a 9-letter word as 2 tokens
    for share in (0.0, 0.5):
        w = Workload(LengthSpec.parse("uniform:1:2048"), LengthSpec.parse("8"), shared_prefix=share, seed=4)
        for i in range(60):
            req = w.request(i)
            assert count_tokens(req.prompt) == req.prompt_tokens


@pytest.mark.parametrize("build", [word_level, byte_bpe])
def test_with_a_tokenizer_prompts_are_exactly_n_of_its_tokens(tmp_path: Path, build):
    tok = LocalTokenizer(build(tmp_path / "tok"))
    spec = LengthSpec.parse("uniform:8:300")
    w = Workload(spec, LengthSpec.parse("8"), counter=tok.count, seed=2)
    for i in range(40):
        req = w.request(i)
        assert req.prompt_tokens == tok.count(req.prompt) == spec.sample(random.Random(f"2:{i}"))
    if build is byte_bpe:  # on this vocabulary a word is several tokens: a word count would be far off
        req = w.request(0)
        assert len(req.prompt.split()) < req.prompt_tokens / 2


def test_fit_words_pads_when_a_word_boundary_skips_over_n():
    def count(text: str) -> int:  # words of 5+ letters are 2 tokens
        return sum(2 if len(word) >= 5 else 1 for word in text.split())

    text, got = fit_words([], ["house"] * 10, 7, count)
    assert got == 7 == count(text) and text.startswith("house house house")


def test_a_bad_tokenizer_path_is_one_line(tmp_path: Path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        LocalTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizer file"):
        LocalTokenizer(tmp_path)
    with pytest.raises(UsageError, match="^--tokenizer "):
        make_plan(ProbeConfig(url="http://127.0.0.1:1", rate=1.0, tokenizer=tmp_path / "missing"))


# -- datasets -------------------------------------------------------------------------------------------------


def test_sharegpt_first_human_turn_is_the_prompt_and_the_answer_gives_the_output_length():
    data = dataset.parse(json.dumps(SHAREGPT), "d.json", engine_tokens)
    assert data.kind == "sharegpt" and data.skipped == 2 and data.timestamps is None
    first, second = data.items
    assert first == {"prompt": "hello there world", "prompt_tokens": 3,
                     "output_tokens": count_tokens("the quick brown fox, jumps")}
    assert first["output_tokens"] == 6  # the comma is a token under the engine's rule
    assert second == {"prompt": "why", "prompt_tokens": 1, "output_tokens": 1}
    with pytest.raises(ValueError, match="no entry has a human turn"):
        dataset.parse(json.dumps(SHAREGPT[2:]), "d.json", engine_tokens)
    with pytest.raises(ValueError, match="JSON list"):
        dataset.parse('{"conversations": []}', "d.json", engine_tokens, sharegpt=True)


def test_sharegpt_counts_with_the_tokenizer_when_given(tmp_path: Path):
    tok = LocalTokenizer(byte_bpe(tmp_path / "tok"))
    data = dataset.parse(json.dumps(SHAREGPT), "d.json", tok.count)
    assert data.items[0]["output_tokens"] == tok.count("the quick brown fox, jumps")
    assert data.items[0]["output_tokens"] != count_tokens("the quick brown fox, jumps")


def test_jsonl_with_timestamps_is_a_trace_in_time_order():
    lines = [{"prompt": "b", "timestamp": 12.5, "output_tokens": 3}, {"prompt": "a", "timestamp": 10.0},
             {"messages": [{"role": "user", "content": "hi you"}], "timestamp": 11},
             {"conversations": SHAREGPT[0]["conversations"], "timestamp": 13}]
    data = dataset.parse("\n".join(json.dumps(x) for x in lines) + "\n\n", "t.jsonl", engine_tokens)
    assert data.timestamps == [0.0, 1.0, 2.5, 3.0]
    assert [x.get("prompt") for x in data.items] == ["a", None, "b", "hello there world"]
    assert data.items[1]["prompt_tokens"] == 2 and data.items[2]["output_tokens"] == 3


@pytest.mark.parametrize("lines, needle", [
    ([{"prompt": "a", "timestamp": 1}, {"prompt": "b"}], "entry 2 has no timestamp"),
    ([{"prompt": "a", "timestamp": -1}], "line 1: timestamp"),
    ([{"prompt": "a", "timestamp": "soon"}], "line 1: timestamp"),
    ([{"prompt": "a", "output_tokens": 0}], "line 1: output_tokens"),
    ([{"text": "a"}], "line 1: needs"),
])
def test_bad_jsonl_entries_are_named(lines, needle):
    with pytest.raises(ValueError, match=needle):
        dataset.parse("\n".join(json.dumps(x) for x in lines), "t.jsonl", engine_tokens)


def test_datasets_are_bounded_in_size_and_entries(tmp_path: Path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p {i}"}) + "\n" for i in range(20)))
    monkeypatch.setattr(dataset, "MAX_ENTRIES", 10)
    with pytest.raises(ValueError, match="more than the 10 entries"):
        dataset.parse(path.read_text(), "p.jsonl", engine_tokens)
    with pytest.raises(ValueError, match="20 entries, more than the 10"):
        dataset.parse(json.dumps([SHAREGPT[0]] * 20), "d.json", engine_tokens)
    monkeypatch.setattr(dataset, "MAX_BYTES", 100)
    with pytest.raises(UsageError, match=r"^--dataset .*more than the 0 MiB") as info:
        read_dataset(path, engine_tokens)
    assert "\n" not in str(info.value)


def test_a_trace_replays_its_timestamps_and_a_rate_overrides_them(tmp_path: Path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p {i}", "timestamp": 100 + i / 2, "output_tokens": 2}) + "\n"
                            for i in range(6)))
    plan = make_plan(ProbeConfig(url="http://127.0.0.1:1", dataset=path))
    assert plan.replay and plan.load.schedule == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5] and plan.total_planned == 6
    assert plan.dataset_info == {"file": str(path), "format": "jsonl", "entries": 6, "skipped": 0,
                                 "timestamps": True, "replayed": True}
    capped = make_plan(ProbeConfig(url="http://127.0.0.1:1", dataset=path, concurrency=2, duration=1.2))
    assert capped.load.schedule == [0.0, 0.5, 1.0] and capped.load.concurrency == 2
    rated = make_plan(ProbeConfig(url="http://127.0.0.1:1", dataset=path, rate=3.0, requests=4))
    assert not rated.replay and rated.spec is not None and rated.total_planned == 4
    with pytest.raises(UsageError, match="--prompts and --dataset"):
        make_plan(ProbeConfig(url="http://127.0.0.1:1", dataset=path, prompts=path))
    untimed = tmp_path / "p.jsonl"
    untimed.write_text('{"prompt": "x"}\n')
    with pytest.raises(UsageError, match="give --rate"):
        make_plan(ProbeConfig(url="http://127.0.0.1:1", dataset=untimed))


@pytest.mark.parametrize(("suffix", "line"), [
    (".json", "nested too deeply to be a ShareGPT list"),
    (".jsonl", "line 1: nested too deeply to be a prompt entry"),
])
def test_a_dataset_nested_thousands_deep_is_one_line_not_a_recursion_error(tmp_path: Path, suffix, line):
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 100_000 + "]" * 100_000 if suffix == ".json" else '{"prompt": ' + "[" * 100_000 + "\n")
    with pytest.raises(UsageError, match=line):
        read_dataset(path, count_tokens)
