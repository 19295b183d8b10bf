"""OutputState: turns a request's stream of ReqUpdates into SGLang-shaped result dicts.

{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
 "cached_tokens", "e2e_latency", ["spec_verify_ct"], ["input_token_logprobs", "output_token_logprobs",
 "input_top_logprobs", "output_top_logprobs"]}}
Logprob entries are [logprob, token_id, token_text or None]. While streaming, text is
cumulative, output logprobs are the new entries only, input logprobs come once; text that
could be the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import time

from transformers import PreTrainedTokenizerBase

from hybrid_sgl.constrained.stop_regex import first_stop_regex_match
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.engine_loop import ReqUpdate
from hybrid_sgl.tokenizer import IncrementalDetokenizer, find_stop, partial_stop_len


def chosen_ids(value, vocab_size: int) -> list[int] | None:
    """token_ids_logprob checked: a list of token ids (None: not asked for)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError(f"token_ids_logprob must be a list of token ids, got {value!r}")
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token_ids_logprob: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    return list(value)


class OutputState:
    def __init__(self, *, rid: str, params: SamplingParams, tokenizer: PreTrainedTokenizerBase | None,
                 return_logprob: bool, top_logprobs_num: int, return_text_in_logprobs: bool,
                 token_ids_logprob: bool = False):
        self.rid = rid
        self.token_ids_logprob = token_ids_logprob  # meta_info carries input / output_token_ids_logprobs
        self.input_ids_logprobs: list = []
        self.output_ids_logprobs: list = []
        self.params = params
        self.tokenizer = tokenizer
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.text_in_logprobs = return_text_in_logprobs
        self.start = time.monotonic()
        self.output_ids: list[int] = []
        self.output_logprobs: list = []
        self.output_top_logprobs: list = []
        self.input_logprobs: list = []
        self.input_top_logprobs: list = []
        self.finish_reason: dict | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.spec_verify_ct: int | None = None
        self.first_token_time: float | None = None
        self.queue_time: float | None = None
        self.detok = (IncrementalDetokenizer(tokenizer, params.skip_special_tokens,
                                             params.spaces_between_special_tokens) if tokenizer else None)
        self._streamed_logprobs = 0
        self._streamed_input = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, u: ReqUpdate) -> None:
        if u.new_ids and self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_ids += u.new_ids
        self.output_logprobs += u.new_logprobs
        self.output_ids_logprobs += u.new_token_ids_logprobs
        if u.input_token_ids_logprobs is not None:
            self.input_ids_logprobs = u.input_token_ids_logprobs
        self.output_top_logprobs += u.new_top_logprobs
        if u.input_logprobs is not None:
            self.input_logprobs, self.input_top_logprobs = u.input_logprobs, u.input_top_logprobs
        self.finish_reason = u.finish_reason
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = (
            u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        self.queue_time = u.queue_time
        self.spec_verify_ct = u.spec_verify_ct

    # ---- text ------------------------------------------------------------------------------------
    def final_text(self) -> str:
        if self.tokenizer is None:
            return ""
        ids = self.output_ids
        matched = (self.finish_reason or {}).get("matched")
        if isinstance(matched, int) and not isinstance(matched, bool) and not self.params.no_stop_trim \
                and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens,
                                     spaces_between_special_tokens=self.params.spaces_between_special_tokens)
        if self.params.stop and not self.params.no_stop_trim:
            hit = find_stop(text, self.params.stop)
            if hit is not None:
                text = text[: hit[0]]
        if self.params.stop_regex and isinstance(matched, str) and not self.params.no_stop_trim:
            text = text[: first_stop_regex_match(text, self.params.stop_regexes)]
        return text

    def streaming_text(self) -> str:
        if self.finished:
            return self.final_text()
        if self.detok is None:
            return ""
        self.detok.add(self.output_ids[len(self.detok.ids):])  # decoded only when someone streams
        text = self.detok.text
        if self.params.stop:
            text = text[: len(text) - partial_stop_len(text, self.params.stop)]
        return text

    # ---- dicts -----------------------------------------------------------------------------------
    def to_dict(self, stream: bool = False) -> dict:
        meta = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": time.monotonic() - self.start,
        }
        if self.spec_verify_ct is not None:
            meta["spec_verify_ct"] = self.spec_verify_ct
        if self.return_logprob:
            self._add_logprobs(meta, stream)
        return {"text": self.streaming_text() if stream else self.final_text(),
                "output_ids": list(self.output_ids), "meta_info": meta}

    def _add_logprobs(self, meta: dict, stream: bool) -> None:
        out_from = self._streamed_logprobs if stream else 0
        send_input = not (stream and self._streamed_input)
        meta["input_token_logprobs"] = self._entries(self.input_logprobs) if send_input else []
        meta["output_token_logprobs"] = self._entries(self.output_logprobs[out_from:])
        # SGLang 0.5.23: the entries so far (not only this chunk's), so a client can place a chunk's entries
        meta["input_token_logprobs_length"] = len(self.input_logprobs)
        meta["output_token_logprobs_length"] = len(self.output_logprobs)
        if self.token_ids_logprob:
            meta["input_token_ids_logprobs"] = ([self._entries(t) if t is not None else None
                                                 for t in self.input_ids_logprobs] if send_input else [])
            meta["output_token_ids_logprobs"] = [self._entries(t) for t in self.output_ids_logprobs[out_from:]]
        if self.top_logprobs_num > 0:
            meta["input_top_logprobs"] = ([self._entries(t) if t is not None else None
                                           for t in self.input_top_logprobs] if send_input else [])
            meta["output_top_logprobs"] = [self._entries(t) for t in self.output_top_logprobs[out_from:]]
        if stream:
            self._streamed_logprobs = len(self.output_logprobs)
            self._streamed_input = self._streamed_input or bool(self.input_logprobs)

    def _entries(self, pairs) -> list[list]:
        if self.text_in_logprobs and self.tokenizer is not None:
            return [[lp, tid, self.tokenizer.decode([tid])] for lp, tid in pairs]
        return [[lp, tid, None] for lp, tid in pairs]
