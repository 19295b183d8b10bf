"""Helpers that build tiny real checkpoints (HF save_pretrained + a trained BPE tokenizer) for
tests, benchmarks with dummy weights, and the bundled default model."""
