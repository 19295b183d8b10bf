"""One shared server for the suite (session scope), on a tiny checkpoint; tests that need other
flags start their own through `server_process.launch`."""

from __future__ import annotations

import pytest
from server_process import launch


@pytest.fixture(scope="session")
def model_path(tiny_checkpoint) -> str:
    return tiny_checkpoint("qwen3_5")


@pytest.fixture(scope="session")
def server(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("server-logs"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture
def url(server) -> str:
    return server.url
