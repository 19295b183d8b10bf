"""What a step's result does to its request: computed tokens, logprobs, the sampled token, the
grammar's matcher, and whether the request is finished (and why, in SGLang's finish_reason shape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hybrid_sgl.constrained.stop_regex import find_stop_regex
from hybrid_sgl.runner.model_runner import BatchItem
from hybrid_sgl.runner.step_results import ItemResult
from hybrid_sgl.scheduler.request import Req


class ResultApplier:
    def __init__(self, *, eos_ids: Iterable[int], context_length: int,
                 stop_string_checker: Callable[[Req], str | None] | None = None):
        """stop_string_checker(req): the stop string req's output ends with, or None (needs a tokenizer)."""
        self.eos_ids = set(eos_ids)
        self.context_length = context_length
        self.stop_string_checker = stop_string_checker

    def apply(self, item: BatchItem, result: ItemResult) -> bool:
        """Apply a step's result to item's request: True when it got a token or finished."""
        req = item.req
        req.num_computed = item.end
        for pos, lp, top in result.input_logprobs:
            req.input_token_logprobs.append((lp, req.prompt_ids[pos]))
            req.input_top_logprobs.append(top)
            req.input_logprob_pos = pos + 1
        req.input_token_ids_logprobs += result.input_token_ids_logprobs
        if result.next_token is None:
            if item.end == req.seq_len and len(req.output_ids) >= req.params.max_new_tokens:
                req.finish({"type": "length", "length": req.params.max_new_tokens})  # prefill only
                return True
            return False
        token = result.next_token
        req.output_ids.append(token)
        if req.grammar is not None and not req.grammar.accept(token):
            req.finish({"type": "abort", "message": f"the sampled token {token} does not fit the grammar "
                        "(min_new_tokens may forbid the only tokens it allows)", "status_code": None,
                        "err_type": None})
            return True
        if req.return_logprob:
            req.output_token_logprobs.append((result.token_logprob, token))
            req.output_top_logprobs.append(result.top_logprobs)
            if req.token_ids_logprob:
                req.output_token_ids_logprobs.append(result.token_ids_logprobs or [])
        self._check_finished(req, token)
        return True

    def _check_finished(self, req: Req, token: int) -> None:
        p = req.params
        n_out = len(req.output_ids)
        if req.grammar is not None and req.grammar.is_terminated():
            req.finish({"type": "stop", "matched": token})
            return
        if n_out >= p.min_new_tokens:
            if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
                req.finish({"type": "stop", "matched": token})
                return
            if p.stop and self.stop_string_checker is not None:
                matched = self.stop_string_checker(req)
                if matched is not None:
                    req.finish({"type": "stop", "matched": matched})
                    return
            if p.stop_regex and self.stop_string_checker is not None:
                matched = find_stop_regex(self.stop_string_checker.tokenizer, req)
                if matched is not None:
                    req.finish({"type": "stop", "matched": matched})
                    return
        if n_out >= p.max_new_tokens:
            req.finish({"type": "length", "length": p.max_new_tokens})
        elif req.seq_len >= self.context_length:
            req.finish({"type": "length", "length": n_out})
