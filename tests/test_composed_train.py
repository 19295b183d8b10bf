"""Train the tiny composed hybrid with its reference model (a plain PyTorch loop on bundled text),
save it, serve the checkpoint here, and check that the served greedy output is the reference's."""

from pathlib import Path

import torch

from hybrid_sgl.reference import load_reference
from hybrid_sgl.testing.tiny_composed import make_composed_checkpoint

TEXT = Path(__file__).resolve().parents[1] / "configs" / "default-model" / "TRAINING.md"
STEPS, BATCH, SEQ = 200, 8, 32


def train(model, ids: torch.Tensor, steps: int) -> list[float]:
    """AdamW on random windows of `ids` [N]; returns the loss of every step. One thread: these small
    ops lose more to a second thread on a shared machine than they gain."""
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - SEQ, (BATCH,), generator=gen).tolist()
            batch = torch.stack([ids[s:s + SEQ] for s in starts])  # [B, T]
            loss = model(batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def test_trained_model_loss_falls_and_served_greedy_output_matches(tmp_path):
    from transformers import AutoTokenizer

    from hybrid_sgl import Engine

    path = make_composed_checkpoint(str(tmp_path / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor(tokenizer(TEXT.read_text()).input_ids)
    model = load_reference(path)
    losses = train(model, ids, STEPS)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.6 * first, f"loss fell only from {first:.3f} to {last:.3f}"
    model.eval().save_pretrained(path)

    engine = Engine(model_path=path, dtype="float32", device="cpu", chunked_prefill_size=16, log_level="warning")
    try:
        for prompt in ["The default model", "Training data: the King James"]:
            prompt_ids = tokenizer(prompt).input_ids
            out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 12})
            assert out["output_ids"] == model.generate(prompt_ids, 12)
        engine.check_integrity()
    finally:
        engine.shutdown()
