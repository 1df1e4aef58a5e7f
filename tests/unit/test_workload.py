"""Workload: length distributions, synthetic prompts, shared prefixes, prompt files, request bodies."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from dsctl.core.load.workload import LengthSpec, Workload, encode_body, load_prompts, request_body


def test_length_specs_parse_and_sample():
    rng = random.Random(0)
    assert LengthSpec.parse("512").sample(rng) == 512
    uni = LengthSpec.parse("uniform:256:1024")
    draws = [uni.sample(rng) for _ in range(5000)]
    assert min(draws) >= 256 and max(draws) <= 1024
    assert statistics.fmean(draws) == pytest.approx(640, rel=0.03)
    normal = LengthSpec.parse("normal:512:64")
    draws = [normal.sample(rng) for _ in range(5000)]
    assert statistics.fmean(draws) == pytest.approx(512, rel=0.02)
    assert statistics.pstdev(draws) == pytest.approx(64, rel=0.08)
    clipped = LengthSpec.parse("normal:2:50")
    draws = [clipped.sample(rng) for _ in range(2000)]
    assert min(draws) >= 1 and max(draws) <= 202
    assert str(uni) == "uniform:256:1024" and str(normal) == "normal:512:64"


@pytest.mark.parametrize("text", ["0", "-3", "abc", "uniform:5", "uniform:9:3", "normal:0:1", "normal:5:-1",
                                  "poisson:3", "uniform:a:b"])
def test_bad_length_specs(text):
    with pytest.raises(ValueError, match="--prompt-tokens"):
        LengthSpec.parse(text, "--prompt-tokens")


def test_synthetic_prompts_have_the_planned_word_count_and_are_deterministic():
    w = Workload(LengthSpec.parse("uniform:50:300"), LengthSpec.parse("64"), seed=4)
    for i in range(20):
        req = w.request(i)
        assert len(req.prompt.split()) == req.prompt_tokens
        assert 50 <= req.prompt_tokens <= 300 and req.output_tokens == 64
    again = Workload(LengthSpec.parse("uniform:50:300"), LengthSpec.parse("64"), seed=4)
    assert again.request(7) == w.request(7)
    other = Workload(LengthSpec.parse("uniform:50:300"), LengthSpec.parse("64"), seed=5)
    assert other.request(7).prompt != w.request(7).prompt
    assert w.request(1).prompt != w.request(2).prompt


def test_shared_prefix_share_is_exact():
    w = Workload(LengthSpec.parse("400"), LengthSpec.parse("8"), shared_prefix=0.25, seed=1)
    a, b = (w.request(i).prompt.split() for i in (3, 4))
    assert a[:100] == b[:100]
    assert a[100] != b[100]  # the unique part starts with the request's index
    none = Workload(LengthSpec.parse("400"), LengthSpec.parse("8"), seed=1)
    a, b = (none.request(i).prompt.split() for i in (3, 4))
    assert a[0] != b[0]
    with pytest.raises(ValueError):
        Workload(LengthSpec.parse("4"), LengthSpec.parse("4"), shared_prefix=1.5)


def test_prompt_files(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello there world", "output_tokens": 5}\n\n'
                    '{"messages": [{"role": "user", "content": "hi you"}]}\n')
    items = load_prompts(path)
    w = Workload(LengthSpec.parse("10"), LengthSpec.parse("7"), prompts=items)
    first, second, third = w.request(0), w.request(1), w.request(2)
    assert first.prompt == "hello there world" and first.prompt_tokens == 3 and first.output_tokens == 5
    assert second.messages == [{"role": "user", "content": "hi you"}] and second.output_tokens == 7
    assert third.prompt == first.prompt  # cycles
    path.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        load_prompts(path)
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_prompts(path)
    with pytest.raises(ValueError, match="missing"):
        load_prompts(tmp_path / "missing.jsonl")


def test_request_bodies_match_vllm_bench():
    req = Workload(LengthSpec.parse("16"), LengthSpec.parse("32")).request(0)
    body = request_body("completions", "m", req)
    assert body["prompt"] == req.prompt and body["max_tokens"] == 32 and body["model"] == "m"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True
    chat = request_body("chat", "m", req, ignore_eos=False)
    assert chat["messages"] == [{"role": "user", "content": req.prompt}]
    assert chat["max_completion_tokens"] == 32 and "ignore_eos" not in chat
    assert json.loads(encode_body(chat)) == chat
    with pytest.raises(ValueError):
        request_body("embeddings", "m", req)
