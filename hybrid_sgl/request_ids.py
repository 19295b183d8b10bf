"""Client request ids: unique while running, and the way abort finds every sequence of a request.

Each generated sequence runs under an internal id that never collides (a counter). The client
sees its own ids: `rid` for one sequence, `rid-j` for the samples of an n > 1 request and
`rid-i` for the items of a batch sent with one rid. A sequence is reachable by every id on the
path to it (`rid`, `rid-i`, `rid-i-j`), so aborting `rid` reaches all its samples and items.
An id that any running sequence answers to cannot be taken by a new request (409).
"""

from __future__ import annotations

import itertools
import threading


class DuplicateRidError(ValueError):
    """A new request uses a rid that a running request already answers to."""


class RidRegistry:
    def __init__(self):
        self._lock = threading.Lock()
        self._owners: dict[str, set[str]] = {}  # client id -> internal ids that answer to it
        self._keys: dict[str, tuple[str, ...]] = {}  # internal id -> the client ids it answers to
        self._counter = itertools.count()

    def new_internal_id(self, visible: str) -> str:
        return f"{visible}#{next(self._counter)}"

    def reserve(self, keys_by_internal: dict[str, tuple[str, ...]]) -> None:
        """Register the sequences of one request, or raise DuplicateRidError and register none."""
        with self._lock:
            for keys in keys_by_internal.values():
                for key in keys:
                    if key in self._owners:
                        raise DuplicateRidError(
                            f"rid {key!r} is already in use by a running request; wait for it to finish, "
                            "abort it, or send a different rid")
            for internal, keys in keys_by_internal.items():
                self._keys[internal] = keys
                for key in keys:
                    self._owners.setdefault(key, set()).add(internal)

    def release(self, internal: str) -> None:
        """The sequence finished (or was aborted): its ids become free."""
        with self._lock:
            for key in self._keys.pop(internal, ()):
                owners = self._owners.get(key)
                if owners is not None:
                    owners.discard(internal)
                    if not owners:
                        del self._owners[key]

    def internal_ids(self, key: str) -> list[str]:
        with self._lock:
            return sorted(self._owners.get(key, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


def sequence_ids(rid: str | list[str] | None, count: int, ns: list[int], new_id) -> list[list[tuple[str, ...]]]:
    """For each of `count` prompts, the client ids of each of its ns[i] sequences: a tuple whose
    last element is the sequence's own id. `new_id()` names a prompt the client did not name.
    Raises ValueError if two sequences of this request would share an id."""
    if isinstance(rid, list):
        if len(rid) != count:
            raise ValueError(f"rid has {len(rid)} entries for {count} prompts")
        if not all(isinstance(r, str) and r for r in rid):
            raise ValueError("rid must be a non-empty string or a list of them")
        dup = next((r for i, r in enumerate(rid) if r in rid[:i]), None)
        if dup is not None:
            raise ValueError(f"rid {dup!r} appears twice in this request; every prompt needs its own rid")
        bases = [(r,) for r in rid]
    elif rid is not None:
        if not isinstance(rid, str) or not rid:
            raise ValueError("rid must be a non-empty string or a list of them")
        bases = [(rid,)] if count == 1 else [(rid, f"{rid}-{i}") for i in range(count)]
    else:
        bases = [(new_id(),) for _ in range(count)]
    result, seen = [], set()
    for base, n in zip(bases, ns):
        seqs = [base] if n == 1 else [base + (f"{base[-1]}-{j}",) for j in range(n)]
        for seq in seqs:
            if seq[-1] in seen:
                raise ValueError(f"rid {seq[-1]!r} appears twice in this request; every prompt and sample "
                                 "needs its own rid")
            seen.add(seq[-1])
        result.append(seqs)
    return result
