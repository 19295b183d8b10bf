"""docker/Dockerfile without a Docker engine: its structure (C compiler and Python headers for Triton,
CUDA build args, non-root user, health check, COPY sources that exist) and a replay of its pip install
steps in a clean venv. The replay is pip's --dry-run against the files the Dockerfile copies, each step
seeing what the steps before it installed (as constraints), with this machine's Python instead of the
image's."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "docker" / "Dockerfile"
NO_NETWORK = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
              "No address associated with hostname")


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, rest = (buf + line).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        buf = ""
    return out


def expand(text: str, values: dict[str, str]) -> str:
    for _ in range(5):  # defaults may refer to earlier args
        text = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)
    return text


def declared(items: list[tuple[str, str]], build_args: dict[str, str] | None = None) -> dict[str, str]:
    """ARG values (a --build-arg, else the default) and ENV values, in order."""
    values: dict[str, str] = {}
    for keyword, rest in items:
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            values[name] = (build_args or {}).get(name, expand(default, values))
        elif keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                values[name] = expand(value, values)
    return values


@pytest.fixture(scope="module")
def stages():
    items = instructions(DOCKERFILE.read_text())
    first_from = next(i for i, (k, _) in enumerate(items) if k == "FROM")
    return items[:first_from + 1], items[first_from + 1:]  # (global args + FROM, build stage)


def run_commands(stage) -> list[str]:
    return [cmd.strip() for k, rest in stage if k == "RUN" for cmd in rest.split("&&")]


def test_base_image_follows_the_cuda_build_arg(stages):
    head, _ = stages
    assert head[-1][0] == "FROM"
    image = expand(head[-1][1], declared(head))
    assert image.startswith("nvidia/cuda:" + declared(head)["CUDA_VERSION"] + "-"), image
    other = expand(head[-1][1], declared(head, {"CUDA_VERSION": "12.8.1", "UBUNTU_VERSION": "22.04"}))
    assert other.startswith("nvidia/cuda:12.8.1-") and other.endswith("ubuntu22.04"), other
    assert expand(head[-1][1], declared(head, {"BASE_IMAGE": "my/cuda:tag"})) == "my/cuda:tag"


def test_stage_uses_only_variables_it_declares(stages):
    # ARGs before FROM are visible to FROM only: a RUN using one silently gets an empty string
    _, stage = stages
    values = declared(stage)
    for keyword, rest in stage:
        if keyword in ("RUN", "HEALTHCHECK"):
            used = {a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", rest)}
            assert used <= set(values), f"{keyword} uses {used - set(values)} not declared after FROM"


def test_triton_can_compile_its_launcher(stages):
    _, stage = stages
    apt = [c for c in run_commands(stage) if "apt-get install" in c]
    packages = set(" ".join(apt).split())
    assert packages & {"gcc", "build-essential", "clang"}, "Triton needs a C compiler"
    assert "python3-dev" in packages, "Triton's launcher needs Python's headers"
    assert "curl" in packages  # the health check's client


def test_runs_as_a_user_with_a_health_check(stages):
    _, stage = stages
    users = [rest for k, rest in stage if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    entry = [i for i, (k, _) in enumerate(stage) if k == "ENTRYPOINT"]
    assert entry and stage.index(("USER", users[-1])) < entry[-1]
    health = " ".join(rest for k, rest in stage if k == "HEALTHCHECK")
    assert "--start-period" in health and re.search(r"http://127\.0\.0\.1:\$\{?PORT\}?/health", health)
    values = declared(stage)
    assert any(k == "EXPOSE" and rest == values["PORT"] for k, rest in stage)


def test_entrypoint_starts_the_launcher(stages):
    # the entrypoint as the container runs it, with this machine's Python for the image's venv
    _, stage = stages
    values = declared(stage)
    entrypoint = json.loads(next(rest for k, rest in stage if k == "ENTRYPOINT"))
    image_python = next(w for w in entrypoint[2].split() if w.endswith("/bin/python"))
    argv = [entrypoint[0], entrypoint[1], entrypoint[2].replace(image_python, sys.executable), *entrypoint[3:]]
    out = subprocess.run([*argv, "--model-path", "/models/a b", "--help"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PORT": values["PORT"]}, cwd=REPO)
    assert out.returncode == 0 and "--model-path" in out.stdout, out.stderr
    assert "-m hybrid_sgl.launch_server --host 0.0.0.0" in entrypoint[2]


def test_copy_sources_exist(stages):
    _, stage = stages
    for keyword, rest in stage:
        if keyword == "COPY":
            *sources, _ = rest.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"


def stage_tree(stage, root: Path) -> Path:
    """The WORKDIR with the Dockerfile's COPY sources in it (as links), as the build sees it."""
    workdir = root
    for keyword, rest in stage:
        if keyword == "WORKDIR":
            workdir = root / rest.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = rest.split()
            for src in sources:
                target = workdir / dest / Path(src).name if dest.endswith("/") else workdir / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(REPO / src)
    return workdir


def test_pip_steps_replay_in_a_clean_venv(stages, tmp_path):
    _, stage = stages
    values = declared(stage)
    commands = [expand(c, values) for c in run_commands(stage)]
    venv_cmd = next(c for c in commands if " -m venv " in c)
    image_venv = venv_cmd.split()[-1]
    steps = [shlex.split(c) for c in commands if re.search(r"\bpip install\b", c)]
    assert steps and all(s[0] == f"{image_venv}/bin/pip" for s in steps), steps
    workdir = stage_tree(stage, tmp_path / "image")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    constraints = tmp_path / "installed.txt"
    constraints.write_text("")
    installed: dict[str, str] = {}
    for i, step in enumerate(steps):
        report = tmp_path / f"report{i}.json"
        cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--dry-run",
               "--quiet", "--report", str(report), "-c", str(constraints), *step[2:]]
        out = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PIP_NO_INPUT": "1"})
        if out.returncode != 0 and any(s in out.stderr for s in NO_NETWORK):
            pytest.skip(f"no package index reachable: {out.stderr.strip().splitlines()[-1]}")
        assert out.returncode == 0, f"{shlex.join(step)}\n{out.stderr[-3000:]}"
        for item in json.loads(report.read_text())["install"]:
            installed[item["metadata"]["name"].lower()] = item["metadata"]["version"]
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in installed.items() if n != "hybrid_sgl"))
    assert installed["torch"].split("+")[0] == values["TORCH_VERSION"]
    for dependency in ("hybrid_sgl", "triton", "transformers", "fastapi", "uvicorn", "safetensors"):
        assert dependency in installed, f"{dependency} would not be installed"
