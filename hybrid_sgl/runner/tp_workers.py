"""Tensor parallelism across processes: rank 0 (the server's process) starts ranks 1..N-1.

Design: one scheduler, on rank 0, broadcasts each step; the other ranks only run forwards.
The alternative, identical schedulers fed the same requests, would need every rank to make the
same decisions from the same inputs: the same arrival order of requests between steps, the
same grammar compile times, the tokenizer for stop strings, the same sampled tokens. Any drift
(a grammar ready one step later on one rank) would make the ranks run different batches and
hang in a collective. Broadcasting the step leaves one source of truth: rank 0 keeps the
scheduler, the prefix cache, the grammars, the tokenizer and the sampler, and sends ranks 1..N-1
what ForwardBatch.build needs plus the prefix cache's pool copies (runner/tp_step.py). Each rank
still owns its pools, sized by the same memory plan, and holds only its own heads' KV and
recurrent state.

Steps go over a pipe per rank (a pickled StepMessage); the tensors of the forward go through
torch.distributed (gloo on CPU, NCCL on CUDA). A rank that exits makes rank 0 log the cause and
exit at once; a rank whose rank 0 is gone exits too.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import socket
import threading
import time

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.distributed import TPGroup, destroy_tp, init_tp
from hybrid_sgl.runner.tp_step import RecordingKVPool, RecordingStatePool, replay
from hybrid_sgl.server_args import ServerArgs

logger = logging.getLogger(__name__)


class TPWorkers:
    """Ranks 1..N-1 of a server; this process joins the group as rank 0."""

    def __init__(self, args: ServerArgs):
        size = args.tp_size
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        for rank in range(1, size):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(args, rank, init_method, theirs), name=f"tp-rank-{rank}",
                               daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        self._closing = threading.Event()
        threading.Thread(target=self._watch, name="tp-watch", daemon=True).start()
        self._threads = torch.get_num_threads()
        _share_cpu(args)
        self.group: TPGroup = init_tp(0, size, init_method, torch.device(args.device), args.ep_size > 1)
        self.pool_classes = (RecordingStatePool, RecordingKVPool)

    def send(self, msg) -> None:
        for conn in self.conns:
            conn.send(msg)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closing.set()
        for conn in self.conns:
            with contextlib.suppress(OSError):  # that rank is gone already
                conn.send(None)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
        destroy_tp(self.group)
        torch.set_num_threads(self._threads)

    def _watch(self) -> None:
        """Exit the server when a rank exits: rank 0 would wait for it in its next collective."""
        by_sentinel = {p.sentinel: p for p in self.procs}
        ready = multiprocessing.connection.wait(list(by_sentinel))
        if self._closing.is_set():
            return
        dead = by_sentinel[ready[0]]
        dead.join(1.0)  # for its exit code
        logger.critical("tensor-parallel rank %s (pid %d) exited with code %s; the server cannot run without it "
                        "and exits (see that rank's log above for the cause)", dead.name.rsplit("-", 1)[-1],
                        dead.pid, dead.exitcode)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        os._exit(1)


def worker_main(args: ServerArgs, rank: int, init_method: str, conn) -> None:
    """Rank `rank`: build this rank's shards and pools, then replay rank 0's steps until told to stop."""
    from hybrid_sgl.runner.model_runner import ModelRunner

    logging.basicConfig(format=f"[%(asctime)s.%(msecs)03d tp{rank} %(name)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("hybrid_sgl").setLevel("WARNING")
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _share_cpu(args)
    tp = init_tp(rank, args.tp_size, init_method, torch.device(args.device), args.ep_size > 1)
    runner = ModelRunner(args, ModelConfig.from_hf(args.model_path), tp)
    with torch.inference_mode():
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # rank 0 is gone
                os._exit(1)
            if msg is None:
                break
            replay(runner, msg)
    destroy_tp(tp)


def _share_cpu(args: ServerArgs) -> None:
    """On CPU the ranks share the cores: each takes its part for its own kernels' threads."""
    if args.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.tp_size))


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
