"""The real server in a subprocess on a free port: `launch(model_path, log_dir, *flags)`, float32,
a small prefill chunk (so chunking is exercised) and a small context."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

CHUNK = 64
CONTEXT = 1024
STARTUP_TIMEOUT_S = 120


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: str
    model_path: str

    def log_tail(self, n: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self, timeout: float = 20.0) -> int:
        """Ctrl-C, as a user would; returns the exit code."""
        return stop_process(self.process, timeout)

    def allocator(self) -> dict:
        return httpx.get(self.url + "/debug/allocator", timeout=30).json()

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Poll until nothing runs or waits, then empty the prefix cache, until every slot and page is
        free; returns the last state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.allocator()
            if state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0:
                httpx.post(self.url + "/flush_cache", timeout=30)
                state = self.allocator()
            idle = (state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
                    and state["num_free_slots"] == state["num_slots"] and state["num_free_pages"] == state["num_pages"])
            if idle or time.monotonic() > deadline:
                return state
            time.sleep(0.05)


def stop_process(process: subprocess.Popen, timeout: float) -> int:
    """Ctrl-C, then a kill if it has not exited within `timeout` seconds; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model_path: str, log_dir, *extra: str, name: str = "server") -> Server:
    port = free_port()
    log_path = os.path.join(str(log_dir), f"{name}-{port}.log")
    cmd = [sys.executable, "-m", "hybrid_sgl.launch_server", "--model-path", model_path, "--port", str(port),
           "--dtype", "float32", "--chunked-prefill-size", str(CHUNK), "--context-length", str(CONTEXT),
           "--log-level", "warning", *extra]
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", process, log_path, model_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not answer /health within {STARTUP_TIMEOUT_S} s:\n{server.log_tail()}")


