"""pytest fixtures and hooks for all of stoker's tests; the shared helpers are in helpers/."""

from __future__ import annotations

import logging
import os
import urllib.request

import fsspec
import pytest
import torch

# Before any test module imports a helper: the asserts in helpers/ report like a test's own.
pytest.register_assert_rewrite("helpers")


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(1)  # steady and identical arithmetic in every test process


@pytest.fixture(autouse=True, scope="session")
def _own_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Measured peaks and linear-kernel choices (stoker.kernels) go to a cache of this session, not the
    user's: tests run with 1 thread and a loaded machine, figures nobody should reuse."""
    os.environ.setdefault("STOKER_CACHE_DIR", str(tmp_path_factory.mktemp("stoker-cache")))


@pytest.fixture(autouse=True)
def _quiet_stoker() -> None:
    logging.getLogger("stoker").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def s3_env():
    """A real S3-protocol server (moto) on the loopback address, its bucket made; the env that reaches it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its buckets per process, not per server: a module run after another one in the
    # same (xdist) process would find the last module's bucket and objects. Start empty.
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"), timeout=30)
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3_class = fsspec.get_filesystem_class("s3")
    s3_class.clear_instance_cache()  # a cached instance would still reach the previous module's server
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("bucket")
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    s3_class.clear_instance_cache()
    server.stop()
