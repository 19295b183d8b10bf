"""SamplingParams: the per-request knobs of SGLang's `sampling_params`, validated up front.

`None` for any field means its default (SGLang's frontend sends explicit nulls). Unknown keys
and features not built yet are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from hybrid_sgl.constrained.backend import GrammarKey, grammar_key

MAX_STOP_STRINGS = 32
MAX_N = 128  # sequences sampled from one prompt
LOGIT_BIAS_LIMIT = 100.0  # as OpenAI
MIN_REPETITION_PENALTY = 0.01  # smaller values overflow the logits
_UNSUPPORTED = ("custom_params",)


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    stream_interval: int | None = None
    # Constrained decoding (at most one of regex / json_schema / ebnf / structural_tag; see constrained/)
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stop_regex: str | list[str] | None = None
    custom_params: dict | None = None  # custom logit processors: accepted as a key, rejected when set

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def adjusts_logits(self) -> bool:
        """Logit bias, penalties or min_new_tokens change the logits before sampling (sampler.adjust_logits)."""
        return bool(self.logit_bias) or self.uses_penalties or self.min_new_tokens > 0

    @staticmethod
    def from_dict(d: dict | None) -> SamplingParams:
        """Build from a JSON-style dict; nulls become defaults; unknown keys raise ValueError."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(SamplingParams)}
        seed = d.pop("seed", None)
        if seed is not None:
            if d.get("sampling_seed") not in (None, seed):
                raise ValueError("seed and sampling_seed differ; give only one of them")
            d["sampling_seed"] = seed
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling_params key(s): {', '.join(unknown)}")
        values = {k: v for k, v in d.items() if v is not None}
        if isinstance(values.get("stop"), str):
            values["stop"] = [values["stop"]]
        if "logit_bias" in values:
            values["logit_bias"] = _logit_bias(values["logit_bias"])
        params = SamplingParams(**values)
        params._check_types()
        return params

    def _check_types(self) -> None:
        ints = ("max_new_tokens", "min_new_tokens", "top_k", "n")
        floats = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
        bools = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in floats:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        for name in bools:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        if self.sampling_seed is not None and (isinstance(self.sampling_seed, bool)
                                               or not isinstance(self.sampling_seed, int)):
            raise ValueError(f"sampling_seed (seed) must be an integer, got {self.sampling_seed!r}")
        if self.stream_interval is not None and (isinstance(self.stream_interval, bool)
                                                 or not isinstance(self.stream_interval, int)
                                                 or self.stream_interval < 1):
            raise ValueError(f"stream_interval must be a positive integer, got {self.stream_interval!r}")
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not (self.stop_regex is None or isinstance(self.stop_regex, str) or (
                isinstance(self.stop_regex, list) and all(isinstance(s, str) for s in self.stop_regex))):
            raise ValueError(f"stop_regex must be a string or a list of strings, got {self.stop_regex!r}")
        if not isinstance(self.custom_params, (dict, type(None))):
            raise ValueError(f"custom_params must be an object, got {self.custom_params!r}")

    def _check_constraints(self) -> None:
        grammar_key(self.regex, self.json_schema, self.ebnf, self.structural_tag)  # types; at most one
        patterns = [self.stop_regex] if isinstance(self.stop_regex, str) else self.stop_regex or []
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ValueError(f"stop_regex must be a string or a list of strings, got {self.stop_regex!r}")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None

    @property
    def grammar_key(self) -> GrammarKey | None:
        return grammar_key(self.regex, self.json_schema, self.ebnf, self.structural_tag)

    @property
    def stop_regexes(self) -> list[str]:
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex or [])

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError naming the first invalid field."""
        for name in _UNSUPPORTED:
            if getattr(self, name) not in (None, "", [], {}):
                raise ValueError(f"{name} is not supported yet")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be a non-negative finite number, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 2], "
                             f"got {self.repetition_penalty}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.min_new_tokens}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        self._check_constraints()
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}")
        for name in ("stop_token_ids", "logit_bias"):
            for t in getattr(self, name):
                if not 0 <= t < vocab_size:
                    raise ValueError(f"{name}: token id {t} is outside the vocabulary [0, {vocab_size})")


def _logit_bias(value) -> dict[int, float]:
    """{token id: bias} from a JSON map (string keys) or a dict; ValueError naming what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be a map of token id to bias, got {value!r}")
    bias = {}
    for key, v in value.items():
        is_id = (isinstance(key, int) and not isinstance(key, bool)) or (
            isinstance(key, str) and key.isascii() and key.lstrip("-").isdigit())
        if not is_id:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -LOGIT_BIAS_LIMIT <= v <= LOGIT_BIAS_LIMIT:
            raise ValueError(f"logit_bias values must be numbers in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], "
                             f"got {v!r} for token {key}")
        bias[int(key)] = float(v)
    return bias
