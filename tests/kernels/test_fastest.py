"""The once-per-key choice between equivalent implementations (triton_kernels/fastest.py), with the
device timing replaced by set times."""

import pytest

from triton_kernels import fastest as fastest_module
from triton_kernels.fastest import chosen, fastest


@pytest.fixture
def times(monkeypatch):
    """name -> the time its run reports; each run returns its name."""
    table: dict[str, float] = {}
    monkeypatch.setattr(fastest_module.triton.testing, "do_bench_cudagraph", lambda run, rep: table[run()])
    monkeypatch.setattr(fastest_module, "_CHOSEN", {})
    monkeypatch.setattr(fastest_module.torch.cuda, "is_current_stream_capturing", lambda: False)
    return table


def _runs(*names):
    return lambda: {name: (lambda name=name: name) for name in names}


def test_the_incumbent_keeps_its_place_within_the_margin(times):
    times.update(a=1.0, b=0.97)
    assert fastest(("k1",), _runs("a", "b"), margin=0.95) == "a"
    times.update(a=1.0, b=0.9)
    assert fastest(("k2",), _runs("a", "b"), margin=0.95) == "b"
    assert fastest(("k3",), _runs("a", "b")) == "b" and chosen(("k3",)) == "b"


def test_a_known_key_is_not_timed_again(times):
    times.update(a=2.0, b=1.0)
    assert fastest(("k",), _runs("a", "b")) == "b"
    times.update(a=0.5)
    assert fastest(("k",), lambda: pytest.fail("built again")) == "b"


def test_nothing_is_timed_inside_a_capture(times, monkeypatch):
    monkeypatch.setattr(fastest_module.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert fastest(("k",), lambda: pytest.fail("timed in a capture")) is None and chosen(("k",)) is None


def test_timing_waits_for_the_callers_queued_work(monkeypatch):
    """graph_time times on do_bench_cudagraph's own stream, which does not wait for the caller's: the device
    is synchronized before, so fn cannot read inputs still being written by queued kernels."""
    calls = []
    monkeypatch.setattr(fastest_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fastest_module.torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(fastest_module.triton.testing, "do_bench_cudagraph",
                        lambda run, rep: calls.append("time") or 1.0)
    assert fastest_module.graph_time(lambda: None) == 1.0
    assert calls == ["synchronize", "time"]


def test_choices_lists_what_was_chosen(times):
    times.update(a=2.0, b=1.0)
    fastest(("k",), _runs("a", "b"))
    assert fastest_module.choices() == {("k",): "b"}
