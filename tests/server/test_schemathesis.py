"""Schemathesis against the served /openapi.json: generated requests for every operation (valid
and invalid by the schema), a small deterministic example budget; no response may be a 5xx.

Generation lengths are capped before each call (max_tokens, max_new_tokens, n) so that the run
stays short; the fuzzing targets input handling, not long generations.
"""

from __future__ import annotations

from collections import Counter

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 10
CAP = {"max_tokens": 4, "max_completion_tokens": 4, "max_new_tokens": 4, "n": 2}


def _cap(params: dict) -> None:
    for key, limit in CAP.items():
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            params[key] = limit


def cap_generation(body) -> None:
    if not isinstance(body, dict):
        return
    _cap(body)
    if ("messages" in body or "prompt" in body) and body.get("max_tokens") is None \
            and body.get("max_completion_tokens") is None:  # null: up to the context length
        body["max_tokens"] = CAP["max_tokens"]
    sampling = body.get("sampling_params")
    for params in sampling if isinstance(sampling, list) else [sampling]:
        if isinstance(params, dict):
            params.setdefault("max_new_tokens", CAP["max_new_tokens"])
            _cap(params)


def test_no_operation_answers_generated_input_with_a_5xx(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    figures: Counter = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            def run(case):
                cap_generation(case.body)
                response = case.call_and_validate(checks=[not_a_server_error], timeout=60)
                figures[f"{response.status_code // 100}xx"] += 1

            try:
                run()
            except Unsatisfiable:  # nothing invalid to generate (a GET without parameters)
                assert mode is GenerationMode.NEGATIVE, operation.label
    print(f"\nschemathesis: {len(list(schema.get_all_operations()))} operations, {dict(figures)}")
    state = server.wait_idle(timeout=30)
    assert state["integrity"] == "ok" and state["num_free_pages"] == state["num_pages"], state
