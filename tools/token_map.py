"""Write a --speculative-token-map: the N most frequent token ids of a text corpus under a model's tokenizer
(the FR-Spec recipe), for the MTP drafts to choose among.

    python tools/token_map.py --tokenizer configs/default-model --top 1024 --out map.json CORPUS...

CORPUS: plain text files, or JSON-lines files whose records hold the text under --field (default "text").
--out ending in .pt is written with torch.save (the format SGLang reads), any other name as a JSON list. Also
printed: the share of the corpus's tokens the map covers, a first guess at how often a draft can be right."""

from __future__ import annotations

import argparse
import collections
import json


def texts(path: str, field: str):
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            for line in f:
                if line.strip():
                    yield json.loads(line)[field]
        else:
            yield f.read()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", nargs="+")
    p.add_argument("--tokenizer", required=True, help="a model folder or tokenizer path (transformers)")
    p.add_argument("--top", type=int, required=True, help="how many token ids to keep")
    p.add_argument("--out", required=True)
    p.add_argument("--field", default="text", help="the text field of .jsonl records")
    a = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)
    counts: collections.Counter = collections.Counter()
    for path in a.corpus:
        for text in texts(path, a.field):
            counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = [t for t, _ in counts.most_common(a.top)]
    total = sum(counts.values())
    covered = sum(counts[t] for t in ids)
    if a.out.endswith(".pt"):
        import torch

        torch.save(torch.tensor(ids, dtype=torch.int64), a.out)
    else:
        with open(a.out, "w") as f:
            json.dump(ids, f)
    print(f"{len(ids)} of {len(counts)} distinct token ids ({total} tokens) cover {covered / total:.1%} of the "
          f"corpus; written to {a.out}")


if __name__ == "__main__":
    main()
