"""Write the lab's tiny model: a Qwen2ForCausalLM checkpoint real vLLM can serve on a CPU, made locally.

No model can be downloaded here (no hub), so the lab makes one: 2 layers, hidden 256, 4 attention heads with 2
KV heads (grouped-query attention, as Qwen2 and DeepSeek's dense distills use), random weights in bf16
safetensors, and a byte-level BPE tokenizer of 4,096 tokens trained on local text with a ChatML chat template (the
Qwen2 family's), so /v1/chat/completions works.  About 3.3 M parameters and 6 s to build; its answers are noise,
which is all a test of vLLM's server, stream, metrics, scheduler and lifecycle needs.

Runs under the Python of the venv real vLLM is installed in (it needs torch, transformers and tokenizers, which
dsctl's own venv does not have), as a script, so it imports nothing from dsctl:

    <vllm-venv>/bin/python -m dsctl.lab.tiny_model OUT      (with dsctl's cli/ on PYTHONPATH), or
    <vllm-venv>/bin/python cli/dsctl/lab/tiny_model.py OUT

The same seed gives the same weights and tokenizer.  OUT is written through a temporary directory and renamed, so
a killed build leaves no half model behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

VOCAB = 4096
LAYERS = 2
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 512
MAX_POSITIONS = 4096
SEED = 1234
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's ChatML template, written out (the tokenizer_config.json key transformers and vLLM read).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def corpus() -> list[str]:
    """Local text to train the BPE on: this Python's own library sources (code, comments and docstrings in
    English, so common words become tokens as in a real vocabulary); nothing downloaded."""
    lines: list[str] = []
    stdlib = Path(os.__file__).parent
    for path in sorted(stdlib.glob("*.py"))[:200]:
        try:
            lines.extend(path.read_text(encoding="utf-8", errors="ignore").splitlines())
        except OSError:
            continue
    return lines


def build(out: Path, seed: int = SEED) -> Path:
    import torch  # noqa: PLC0415 - only in the vLLM venv
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415

    torch.manual_seed(seed)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, torch_dtype="bfloat16",
                         eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                         bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        fast.save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp's 0700 would keep the service account out
        for part in staging.iterdir():
            part.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the model directory to write (replaced if present)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    print(build(args.out, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
