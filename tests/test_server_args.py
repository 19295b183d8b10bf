"""SGLang users' launch commands: SGLang's flags and values parse and resolve to ours, what cannot run
here is refused before any heavy work with a message naming what to use instead; values that would
break every request exit the launcher with status 2 and one line naming the flag; --help shows every
default and every choice."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from hybrid_sgl import launch_server
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.constrained.backend import BACKENDS
from hybrid_sgl.launch_server import parse_args
from hybrid_sgl.layers.backends import resolve_backend
from hybrid_sgl.models import loader
from hybrid_sgl.models.base import Backends
from hybrid_sgl.server.reasoning_parser import PARSERS
from hybrid_sgl.server.tool_parser import ALIASES, GRAMMAR_MODELS
from hybrid_sgl.server_args import BUNDLED_MODEL, ServerArgs

ON_GPU = torch.cuda.is_available()
# From SGLang's docs for a Qwen3.5 model (the model path is ours: nothing is downloaded here).
SGLANG_QWEN35 = ["--port", "30000", "--tp-size", "1", "--mem-fraction-static", "0.8", "--trust-remote-code",
                 "--dtype", "half", "--attention-backend", "flashinfer", "--reasoning-parser", "qwen3",
                 "--tool-call-parser", "qwen25"]
TEMPLATE = os.path.join(BUNDLED_MODEL, "chat_template.jinja")
PROG = "python -m hybrid_sgl.launch_server: error: "


def resolve(*flags: str):
    return parse_args(["--model-path", BUNDLED_MODEL, *flags]).resolved()


def refusal(*flags: str, error=ValueError) -> str:
    with pytest.raises(error) as e:
        resolve(*flags)
    return str(e.value)


def cli_refusal(capsys, *flags: str) -> str:
    """The launcher's refusal: exit status 2 and one line on stderr, returned."""
    with pytest.raises(SystemExit) as e:
        parse_args(["--model-path", BUNDLED_MODEL, *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(PROG) and err.count("\n") == 1, err
    return err


def config_only(tmp_path, **overrides) -> str:
    """A model folder with config and tokenizer but no weights."""
    for name in os.listdir(BUNDLED_MODEL):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(BUNDLED_MODEL, name), tmp_path / name)
    if overrides:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, **overrides}))
    return str(tmp_path)


def test_sglang_qwen35_command_resolves(caplog):
    with caplog.at_level(logging.INFO, logger="hybrid_sgl"):
        args = resolve(*SGLANG_QWEN35)
    assert (args.dtype, args.tp_size, args.port, args.mem_fraction_static) == ("float16", 1, 30000, 0.8)
    assert args.attention_backend == ("triton" if ON_GPU else "torch")
    assert (args.reasoning_parser, args.tool_call_parser, args.trust_remote_code) == ("qwen3", "qwen25", True)
    assert f"--attention-backend flashinfer is SGLang's name; the closest backend here on {args.device}: " \
           f"{args.attention_backend}" in caplog.text


@pytest.mark.parametrize("flags, field, value", [
    ("--tensor-parallel-size 1", "tp_size", 1), ("--tp 1", "tp_size", 1), ("--dp-size 1", "dp_size", 1),
    ("--data-parallel-size 1", "dp_size", 1), ("--dtype float", "dtype", "float32"),
    ("--attention-backend torch_native", "attention_backend", "torch"),
    ("--attention-backend fa3", "attention_backend", "triton" if ON_GPU else "torch"),
    ("--log-level critical", "log_level", "critical"), ("--enable-metrics", "enable_metrics", True),
    ("--disable-radix-cache", "disable_radix_cache", True), ("--schedule-policy fcfs", "schedule_policy", "fcfs"),
    ("--grammar-backend none", "grammar_backend", "none"), ("--max-mamba-cache-size 64", "max_mamba_cache_size", 64),
    ("--chat-template " + TEMPLATE, "chat_template", TEMPLATE), ("--kv-cache-dtype auto", "kv_cache_dtype", "auto"),
])
def test_sglang_spellings(flags, field, value):
    assert getattr(resolve(*flags.split()), field) == value


def test_model_alias_and_max_prefill_tokens():
    args = parse_args(["--model", BUNDLED_MODEL, "--max-prefill-tokens", "1024"]).resolved()
    assert args.model_path == BUNDLED_MODEL and args.chunked_prefill_size == 1024
    assert resolve("--max-prefill-tokens", "16384").chunked_prefill_size == 8192  # the smaller budget wins


@pytest.mark.parametrize("flags, remedy", [
    ("--tp 8", "--tp-size 1"),
    ("--tensor-parallel-size 3", "--tp-size 1"),
])
def test_refusals_name_the_alternative(flags, remedy):
    assert remedy in refusal(*flags.split())


@pytest.mark.parametrize("flags, remedy", [
    ("--dp-size 2", "--dp-size 1"),
    ("--quantization awq", "use --quantization fp8"),
    ("--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype auto"),
    ("--max-total-tokens 8", "--max-total-tokens 16 or more"),
    ("--max-total-tokens 40 --page-size 64", "--max-total-tokens 64 or more"),
    ("--max-prefill-tokens 512 --chunked-prefill-size -1", "drop one of the two"),
])
def test_launcher_refusals_name_the_alternative(flags, remedy, capsys):
    assert remedy in cli_refusal(capsys, *flags.split())


@pytest.mark.parametrize("flags, flag", [
    ("--tool-call-parser foo", "--tool-call-parser foo: choose one of qwen25, qwen3_coder"),
    ("--reasoning-parser bar", "--reasoning-parser bar: choose one of qwen3"),
    ("--chat-template /nonexistent.jinja", "--chat-template /nonexistent.jinja: cannot read"),
    ("--mem-fraction-static 1.5", "--mem-fraction-static"), ("--mem-fraction-static 0", "--mem-fraction-static"),
    ("--mem-fraction-static nan", "--mem-fraction-static"),
    ("--max-running-requests 0", "--max-running-requests must be >= 1"),
    ("--grammar-backend llguidance", "--grammar-backend llguidance: choose one of xgrammar, none"),
    ("--max-total-tokens 0", "--max-total-tokens"), ("--chunked-prefill-size 0", "--chunked-prefill-size"),
    ("--chunked-prefill-size -2", "--chunked-prefill-size"), ("--page-size 0", "--page-size"),
    ("--tp-size 0", "--tp-size"), ("--context-length 0", "--context-length"),
    ("--cuda-graph-max-bs 0", "--cuda-graph-max-bs"), ("--cuda-graph-max-tokens -1", "--cuda-graph-max-tokens"),
    ("--max-prefill-tokens 0", "--max-prefill-tokens"), ("--max-mamba-cache-size 0", "--max-mamba-cache-size"),
    ("--snapshot-interval 0", "--snapshot-interval"), ("--mamba-full-memory-ratio 0", "--mamba-full-memory-ratio"),
    ("--port 0", "--port"), ("--port 70000", "--port"), ("--dtype fp4", "--dtype fp4: choose one of"),
])
def test_values_that_break_every_request_exit_2_naming_the_flag(flags, flag, capsys, monkeypatch):
    def must_not_run(*_):
        raise AssertionError("the launcher went on past the refusal")

    monkeypatch.setattr(launch_server, "bind_port", must_not_run)  # before the port, let alone the weights
    with pytest.raises(SystemExit) as e:
        launch_server.main(["--model-path", BUNDLED_MODEL, *flags.split()])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(PROG) and err.count("\n") == 1 and flag in err, err


def test_the_same_checks_guard_the_engine_arguments():
    for kwargs, message in [({"tool_call_parser": "foo"}, "--tool-call-parser foo"),
                            ({"grammar_backend": "llguidance"}, "--grammar-backend llguidance"),
                            ({"mem_fraction_static": 0.0}, "--mem-fraction-static"),
                            ({"max_running_requests": 0}, "--max-running-requests")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model_path=BUNDLED_MODEL, **kwargs).resolved()


def test_launcher_process_exits_2_in_seconds():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hybrid_sgl.launch_server", "--tool-call-parser", "foo"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr == PROG + "--tool-call-parser foo: choose one of qwen25, qwen3_coder, " \
        "qwen, qwen3\n" and time.monotonic() - t0 < 30


@pytest.mark.parametrize("flags, field, value", [
    ("--chunked-prefill-size -1", "chunked_prefill_size", -1),
    ("--mem-fraction-static 1", "mem_fraction_static", 1),
    ("--cuda-graph-max-tokens 0", "cuda_graph_max_tokens", 0),
    ("--tool-call-parser qwen3", "tool_call_parser", "qwen3"),
    ("--tool-call-parser qwen3_coder", "tool_call_parser", "qwen3_coder"),
    ("--quantization fp8", "quantization", "fp8"),
])
def test_edge_values_that_mean_something_are_accepted(flags, field, value):
    assert getattr(parse_args(["--model-path", BUNDLED_MODEL, *flags.split()]), field) == value


@pytest.mark.parametrize("template, problem", [
    ("{% if %}", "Expected an expression"),
    ("{{ raise_exception('no conversation fits') }}", "no conversation fits"),
    ("{% for m in messages %}{{ m.content.missing.attribute }}{% endfor %}", "missing"),
    ("{# nothing #}", "empty prompt"),
])
def test_a_chat_template_that_cannot_render_is_refused(template, problem, tmp_path, capsys):
    path = tmp_path / "broken.jinja"
    path.write_text(template)
    err = cli_refusal(capsys, "--chat-template", str(path))
    assert f"--chat-template {path}: the template renders neither" in err and problem in err


def test_a_chat_template_needs_only_one_of_the_two_conversations(tmp_path):
    path = tmp_path / "no_system.jinja"  # as Gemma-style templates: no system role
    path.write_text("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
                    "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert parse_args(["--model-path", BUNDLED_MODEL, "--chat-template", str(path)]).chat_template == str(path)


def test_help_shows_every_default_and_every_choice(capsys):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for action in parser._actions[1:]:  # after -h
        assert "Default" in action.help, action.option_strings
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    shown = {"--tool-call-parser": [*GRAMMAR_MODELS, *ALIASES], "--reasoning-parser": list(PARSERS),
             "--quantization": ["fp8"], "--grammar-backend": [*BACKENDS, "none"]}
    for flag, choices in shown.items():
        assert f"{flag} {{{','.join(choices)}}}" in text, flag
    assert "llguidance" not in text


@pytest.mark.skipif(ON_GPU, reason="checks a CPU machine")
@pytest.mark.parametrize("flag", ["--attention-backend", "--linear-attn-backend", "--moe-runner-backend"])
def test_triton_backend_on_cpu_is_refused(flag, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert f"{flag} triton needs a CUDA GPU" in refusal(flag, "triton")
    assert f"use {flag} torch" in refusal(flag, "triton")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        resolve_backend("attention", "triton", "cpu")


def test_weights_missing_names_load_format_dummy(tmp_path):
    path = config_only(tmp_path)
    message = refusal("--model-path", path, error=FileNotFoundError)
    assert "no weights" in message and "--load-format dummy" in message
    assert resolve("--model-path", path, "--load-format", "dummy").load_format == "dummy"


def test_missing_shard_is_named(tmp_path):
    path = config_only(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    assert "model-00001.safetensors" in refusal("--model-path", path, error=FileNotFoundError)


def test_unsupported_quantized_checkpoint_is_refused(tmp_path):
    path = config_only(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4})
    message = refusal("--model-path", path, "--load-format", "dummy")
    assert "quantized weights (gptq)" in message and "quant_method 'gptq'" in message
    assert "unquantized (bf16) release" in message


def test_block_fp8_checkpoint_is_accepted(tmp_path):
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    path = config_only(tmp_path, quantization_config=fp8)
    assert resolve("--model-path", path, "--load-format", "dummy").model_path == path


def test_hub_id_is_not_downloaded():
    message = refusal("--model-path", "Qwen/Qwen3.5-9B", error=FileNotFoundError)
    assert "huggingface-cli download Qwen/Qwen3.5-9B" in message


def test_weights_that_cannot_fit_fail_before_building(tmp_path):
    # 2**33 rows of embedding x 64 = 2 TiB in float32, measured on the meta device in well under a minute
    config = ModelConfig.from_hf(config_only(tmp_path, vocab_size=2**33))
    device = torch.device("cpu")
    backends = Backends(attention=resolve_backend("attention", "torch", "cpu"),
                        linear_attention=resolve_backend("linear_attention", "torch", "cpu"), ssm=None, moe=None)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"the weights need \d+\.\d GiB in float32 but cpu has .* GiB available: "
                                         r"use --dtype bfloat16"):
        loader.build_model(config, backends, dtype=torch.float32, device=device, max_positions=128,
                           load_format="dummy", model_path=str(tmp_path), seed=0)
    assert time.monotonic() - t0 < 30


def test_load_progress_is_log_lines_off_a_terminal(caplog, capsys):
    with caplog.at_level(logging.INFO, logger="hybrid_sgl"):
        names = [n for n, _ in loader.iter_checkpoint(BUNDLED_MODEL)]
    lines = [r.message for r in caplog.records if r.message.startswith("loading weights:")]
    assert lines[-1] == f"loading weights: {len(names)}/{len(names)} tensors (100%)" and 5 <= len(lines) <= 11
    assert "tensor/s" not in capsys.readouterr().err  # no tqdm bar in a log file


def test_the_launcher_socket_says_it_is_tcp_so_responses_are_not_delayed():
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket's proto is TCP."""
    import socket

    from hybrid_sgl.launch_server import bind_port

    sock = bind_port("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_the_server_process_shortens_the_gil_switch_interval(monkeypatch):
    """The HTTP event loop shares the interpreter with the engine thread: launch_server sets its switch
    interval (bench/http_intake.py measures why) before anything else runs."""
    from hybrid_sgl import launch_server

    def stop(*_):
        raise ValueError("stop here")

    monkeypatch.setattr(launch_server, "bind_port", stop)
    before = sys.getswitchinterval()
    try:
        assert launch_server.main(["--model-path", BUNDLED_MODEL]) == 2
        assert sys.getswitchinterval() == pytest.approx(launch_server.SWITCH_INTERVAL_S)
        assert launch_server.SWITCH_INTERVAL_S < 0.005  # shorter than Python's default
    finally:
        sys.setswitchinterval(before)
