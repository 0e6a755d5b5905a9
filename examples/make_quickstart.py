"""Make the quickstart's model and data, offline and deterministically.

    python examples/make_quickstart.py [--out examples/quickstart]

The task: say whether a short review is positive or negative. Reviews mix filler words with one
sentiment word; the model has to find that word and map it to the label. The base model is a tiny
Llama, briefly pre-trained here on unlabeled reviews (so it knows the words but not the task); the
quickstart then teaches it the task with LoRA. The last `eval_examples` lines of train.jsonl are held
back by the trainer for the before/after check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path
from typing import Any

POSITIVE = [
    "great",
    "superb",
    "lovely",
    "excellent",
    "wonderful",
    "delightful",
    "charming",
    "brilliant",
    "splendid",
    "pleasant",
    "fantastic",
    "marvelous",
    "enjoyable",
    "stunning",
    "gorgeous",
    "perfect",
    "sweet",
    "cheerful",
    "elegant",
    "fine",
]
NEGATIVE = [
    "awful",
    "terrible",
    "dreadful",
    "horrible",
    "boring",
    "dull",
    "bland",
    "nasty",
    "poor",
    "grim",
    "tedious",
    "clumsy",
    "sloppy",
    "lousy",
    "rotten",
    "gloomy",
    "stale",
    "shabby",
    "weak",
    "ugly",
]
SUBJECTS = [
    "the film",
    "soup",
    "hotel",
    "concert",
    "book",
    "game",
    "cafe",
    "show",
    "train",
    "garden",
    "museum",
    "album",
    "pizza",
    "lecture",
    "trip",
]
FILLER = [
    "honestly",
    "really",
    "quite",
    "rather",
    "truly",
    "simply",
    "frankly",
    "overall",
    "mostly",
    "somewhat",
    "today",
    "again",
    "also",
    "still",
    "very",
    "so",
]
TEMPLATES = [
    "{s} was {f} {w}",
    "{f} , {s} felt {w}",
    "i found {s} {f} {w}",
    "{s} is {w} , {f}",
    "we thought {s} was {f} {w} today",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def review(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(["positive", "negative"])
    word = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
    subject = rng.choice(SUBJECTS).removeprefix("the ").strip()
    text = rng.choice(TEMPLATES).format(s=f"the {subject}", f=rng.choice(FILLER), w=word)
    return text, label


def make_data(out: Path, n_train: int, n_eval: int, seed: int) -> None:
    rng = random.Random(seed)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w", encoding="utf-8") as handle:
        for _ in range(n_train + n_eval):
            text, label = review(rng)
            row = {"instruction": "Is this review positive or negative?", "input": text, "output": label}
            handle.write(json.dumps(row) + "\n")


def build_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on `corpus`, with pad/bos/eos/end tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def make_model(out: Path, seed: int, pretrain_steps: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    rng = random.Random(seed + 1)
    corpus = [review(rng)[0] for _ in range(4000)]
    corpus += [
        "### Instruction:\nIs this review positive or negative?\n\n### Input:\n",
        "### Response:\n",
        "positive negative",
    ] * 50
    hf_tok = build_tokenizer(corpus, vocab_size=512)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    # a little language-model pre-training on unlabeled reviews: the base knows the words, not the task
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    texts = [hf_tok(t)["input_ids"] + [hf_tok.eos_token_id] for t in corpus[:4000]]
    model.train()
    for step in range(pretrain_steps):
        batch = [texts[(step * 32 + i) % len(texts)] for i in range(32)]
        width = max(len(b) for b in batch)
        ids = torch.full((len(batch), width), hf_tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for row, b in enumerate(batch):
            ids[row, : len(b)] = torch.tensor(b)
            labels[row, : len(b)] = torch.tensor(b)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out / "model")
    hf_tok.save_pretrained(out / "model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "quickstart"))
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    out = Path(args.out)
    if args.force or not (out / "data" / "train.jsonl").exists():
        make_data(out, args.train, args.eval, args.seed)
    if args.force or not (out / "model" / "config.json").exists():
        make_model(out, args.seed, args.pretrain_steps)
    print(f"quickstart model and data in {out}")


if __name__ == "__main__":
    main()
