"""Question: what does constrained decoding (a JSON schema) cost against the same batch unconstrained, and does
a new grammar's compile stall the running requests?

Constrained decoding cost: decode tok/s of a batch with a 10-field JSON schema against the same
batch unconstrained (each run three times, alternated; the better run of each side), and the median
time of the decode steps that give every request a token (a constrained request that finishes early
shrinks its batch, so the whole-generate tok/s compares unlike batches; the step times do not), the time to attach a
cached grammar, and the step times of running requests while a new grammar compiles (they must not
stall). Every constrained output is checked to be valid JSON for the schema (or a prefix of it, when
the tokens run out).

    python bench/structured.py --config configs/qwen3_5-9b-text --tokenizer configs/default-tiny-qwen3_5 \
        --batch 32 --output 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from hybrid_sgl import Engine
from hybrid_sgl.constrained import GrammarKey

FIELDS = ["name", "city", "street", "country", "email", "phone", "company", "title", "color", "note"]
SCHEMA = {"type": "object", "properties": {f: {"type": "string", "minLength": 8, "maxLength": 16} for f in FIELDS},
          "required": FIELDS, "additionalProperties": False}
NEW_SCHEMA = {"type": "object", "properties": {f"k{i}": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}
                                               for i in range(40)}}


def timed_steps(engine: Engine) -> list[tuple[float, float, int]]:
    """Wrap the scheduler's step: (start, seconds, tokens emitted) per step, appended as they run."""
    sched, records = engine.scheduler, []
    step = sched.step

    def wrapped():
        t = time.perf_counter()
        changed = step()
        records.append((t, time.perf_counter() - t, len(changed)))
        return changed

    sched.step = wrapped
    return records


def decode_rate(engine: Engine, prompts: list[list[int]], params: dict, records: list) -> tuple[float, float, list]:
    """(tok/s of the whole generate, median seconds of its steps that gave every request a token, outputs)."""
    engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 4})  # warm up
    first = len(records)
    t = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t
    full = [s for _, s, n in records[first:] if n == len(prompts)]
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / dt, statistics.median(full), outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/qwen3_5-9b-text")
    ap.add_argument("--tokenizer", default="configs/default-tiny-qwen3_5")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--engine-arg", action="append", default=[], help="key=value (JSON value) for Engine")
    a = ap.parse_args()
    extra = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.engine_arg)}
    engine = Engine(model_path=a.config, load_format="dummy", tokenizer_path=a.tokenizer, context_length=2048,
                    log_level="warning", **extra)
    vocab = min(engine.model_config.vocab_size, len(engine.tokenizer))
    prompts = [[(17 * i + 31 * j) % (vocab - 10) + 5 for j in range(a.prompt)] for i in range(a.batch)]
    base = {"max_new_tokens": a.output, "temperature": 0.8}
    rates: dict[str, list[float]] = {"free": [], "json": []}
    steps: dict[str, list[float]] = {"free": [], "json": []}
    records = timed_steps(engine)
    for _ in range(3):  # alternated, so that neither side alone pays a cold start
        rate, step, _ = decode_rate(engine, prompts, {**base, "ignore_eos": True}, records)
        rates["free"].append(rate)
        steps["free"].append(step)
        rate, step, outs = decode_rate(engine, prompts, {**base, "json_schema": json.dumps(SCHEMA)}, records)
        rates["json"].append(rate)
        steps["json"].append(step)
    print(f"runs, tok/s: free {', '.join(f'{r:.0f}' for r in rates['free'])}; "
          f"json-schema {', '.join(f'{r:.0f}' for r in rates['json'])}")
    print(f"runs, median ms of the steps that gave all {a.batch} requests a token: free "
          f"{', '.join(f'{s * 1e3:.2f}' for s in steps['free'])}; json-schema "
          f"{', '.join(f'{s * 1e3:.2f}' for s in steps['json'])}")
    free, constrained = max(rates["free"]), max(rates["json"])
    free_step, json_step = statistics.median(steps["free"]), statistics.median(steps["json"])
    stops = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    for o in stops:
        obj = json.loads(o["text"])
        assert sorted(obj) == sorted(FIELDS), obj
    assert all(o["text"].startswith("{") for o in outs)
    print(f"| batch | free tok/s | json-schema tok/s | ratio | finished by the grammar |\n|---|---|---|---|---|\n"
          f"| {a.batch} | {free:.0f} | {constrained:.0f} | {constrained / free:.3f} | {len(stops)}/{len(outs)} |")
    print(f"\nwhole-batch decode steps (the median run): free {free_step * 1e3:.2f} ms, json-schema "
          f"{json_step * 1e3:.2f} ms: json-schema at {free_step / json_step:.1%} of the free speed")

    cache = engine.scheduler.grammars
    key = GrammarKey("json", json.dumps(SCHEMA))
    t = time.perf_counter()
    for _ in range(100):
        cache.matcher(key)
    print(f"\nattach a cached grammar (lookup + matcher): {(time.perf_counter() - t) * 10:.3f} ms")

    # a new grammar compiles while the batch decodes: step times before and during the compile
    it = engine.generate(input_ids=prompts[:-1], sampling_params={**base, "ignore_eos": True}, stream=True)
    for _ in range(20):
        next(it)
    t0 = time.perf_counter()
    future = cache.get(GrammarKey("json", json.dumps(NEW_SCHEMA)))
    future.result()
    t1 = time.perf_counter()
    for _ in it:
        pass
    before = [dt for s, dt, _ in records if s < t0 and dt > 0][-20:]
    during = [dt for s, dt, _ in records if t0 <= s <= t1]
    print(f"new grammar compiled in {(t1 - t0) * 1e3:.1f} ms off the engine thread; decode step ms: "
          f"before median {statistics.median(before) * 1e3:.2f} max {max(before) * 1e3:.2f}, during median "
          f"{statistics.median(during) * 1e3 if during else float('nan'):.2f} max "
          f"{max(during) * 1e3 if during else float('nan'):.2f} ({len(during)} steps)")
    engine.shutdown()


if __name__ == "__main__":
    main()
