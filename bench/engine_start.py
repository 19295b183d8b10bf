"""Start an Engine on a config with dummy weights, run one short request, print the memory plan
and exit: a quick check that a configuration starts on the device.

    PYTHONPATH=$PWD python bench/engine_start.py --config configs/qwen3_5-9b-text [--engine-arg KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    from hybrid_sgl import Engine

    extra = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    engine = Engine(model_path=args.config, load_format="dummy", skip_tokenizer_init=True, random_seed=0, **extra)
    try:
        out = engine.generate(input_ids=list(range(10, 100)), sampling_params={"max_new_tokens": 4, "temperature": 0})
        info = engine.server_info()
        print(json.dumps({"ok": True, "output_ids": out["output_ids"], "max_total_num_tokens":
                          info["max_total_num_tokens"], "max_snapshots": info["max_snapshots"]}))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
