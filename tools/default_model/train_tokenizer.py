"""Train the default model's tokenizer: byte-level BPE on the training split, ChatML special tokens
(the bundled tiny model's conventions) and the chat template of chat_template.jinja here (the tiny
model's ChatML, plus tools in Qwen3's <tool_call> format), saved as tokenizer.json +
tokenizer_config.json (+ chat_template.jinja) into tools/default_model/tokenizer/.

    python tools/default_model/train_tokenizer.py [--data .data/default_model] [--vocab-size 6144]
"""

from __future__ import annotations

import argparse
import json
import os

from hybrid_sgl.testing.tiny_checkpoint import SPECIAL_TOKENS

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_DIR = os.path.join(HERE, "tokenizer")
CHAT_TEMPLATE_FILE = os.path.join(HERE, "chat_template.jinja")
VOCAB_SIZE = 6144


def train_texts(data_dir: str):
    with open(os.path.join(data_dir, "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train_tokenizer(data_dir: str, vocab_size: int, out_dir: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_texts(data_dir), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    with open(CHAT_TEMPLATE_FILE, encoding="utf-8") as f:
        fast.chat_template = f.read()
    fast.save_pretrained(out_dir)
    return fast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(".data", "default_model"))
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--out", default=TOKENIZER_DIR)
    args = parser.parse_args()
    fast = train_tokenizer(args.data, args.vocab_size, args.out)
    sample = "HAMLET:\nTo be, or not to be, that is the question."
    print(f"vocab {len(fast)}; {sample!r} -> {fast.tokenize(sample)}")


if __name__ == "__main__":
    main()
