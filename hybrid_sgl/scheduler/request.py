"""Req: one generation request and its state machine.

WAITING --admit--> RUNNING (owns a state slot and pages) --finish/abort--> FINISHED
RUNNING --preempt--> WAITING (slot and pages released; recomputed from its tokens later)

Invariant while RUNNING: the pool holds state and KV for `fill_ids[:num_computed]`. The last
sampled token is not computed yet, so a decoding request has `num_computed == len(fill_ids) - 1`.
"""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from hybrid_sgl.constrained.backend import GrammarMatcher
from hybrid_sgl.memory.prefix_cache import Node
from hybrid_sgl.sampling_params import SamplingParams


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = 0  # first prompt position whose logprob is returned (resolved, >= 0)
    top_logprobs_num: int = 0
    arrival: int = 0  # admission order, for FCFS and for choosing whom to preempt
    arrival_time: float = 0.0  # time.monotonic() when the engine received it

    status: ReqStatus = ReqStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    cache_node: Node | None = None  # prefix-cache node this request locks (it reads or writes its pages)
    branch_pos: int = 0  # cached pages go on to here without a snapshot: take one here
    restored_at: int = 0  # where its last admission restored a snapshot (0: none)
    shared_cuts: dict[int, int] = field(default_factory=dict)  # the chunk's cuts others share -> tokens each saves
    prompt_head: tuple[int, ...] | None = None  # first prompt tokens, to find requests sharing a prefix fast
    finish_reason: dict | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    # logprobs: (logprob or None, token id); top lists hold (logprob, token id) pairs
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprob_pos: int = 0  # next prompt position whose logprob is still to be computed
    # constrained decoding (params.grammar_key): its compile, then its matcher once compiled
    grammar_future: Future | None = None
    grammar: GrammarMatcher | None = None
    # token_ids_logprob: these ids' logprobs at every returned position (None at the first prompt one)
    token_ids_logprob: list[int] | None = None
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    # speculative decoding: drafts for the verify step at position spec_base (runner/speculative.py)
    spec_drafts: list[int] = field(default_factory=list)
    spec_base: int = -1
    spec_verify_ct: int = 0  # verify steps with drafts this request took part in

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """fill_ids[start:end] without building fill_ids."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n:end - n]
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[:end - n]

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens of fill_ids not yet in the pool."""
        return self.seq_len - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.status is ReqStatus.RUNNING and self.num_computed > 0 and self.remaining == 1

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    def start_input_logprobs(self) -> None:
        """Set where prompt logprobs start; position 0 has none (an entry without a logprob)."""
        if self.return_logprob and self.logprob_start_len == 0:
            self.input_token_logprobs.append((None, self.prompt_ids[0]))
            self.input_top_logprobs.append(None)
            self.input_token_ids_logprobs.append(None)
            self.input_logprob_pos = 1
        else:
            self.input_logprob_pos = self.logprob_start_len

    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.input_logprob_pos < len(self.prompt_ids)

    def finish(self, reason: dict) -> None:
        """reason: SGLang's finish_reason JSON, e.g. {"type": "stop", "matched": 2},
        {"type": "length", "length": 16}, {"type": "abort", "message": ...}."""
        self.status = ReqStatus.FINISHED
        self.finish_reason = reason
