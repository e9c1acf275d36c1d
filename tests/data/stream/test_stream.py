"""The object-store file layer on a real S3-protocol server (moto on loopback, s3fs as the
client): listing, opening through the cache, eviction, several processes, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from stoker.data.stream import FileSet, ShardCache, StreamOptions, files_of, list_files, local_path, open_file
from stoker.errors import DataError, StorageError
from stoker.storage import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=2, backoff=0.0)


def _upload(folder: Path, url: str) -> None:
    fs = fsspec.filesystem("s3")
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{url.removeprefix('s3://')}/{p.relative_to(folder).as_posix()}")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    for i in range(4):
        (folder / f"part-{i}").write_bytes(bytes([i]) * (1000 + i))
    (folder / "sub" / "deep").write_bytes(b"deep")
    (folder / ".hidden").write_bytes(b"x")
    return folder


def test_s3_files_list_and_read_as_the_local_ones(s3_env, data, tmp_path):
    _upload(data, "s3://bucket/list")
    local = files_of(data)
    remote = files_of("s3://bucket/list")
    assert [f.url for f in remote] == [f"s3://bucket/list/{Path(f.url).relative_to(data).as_posix()}" for f in local]
    assert [f.size for f in remote] == [f.size for f in local] and all(f.version for f in remote)
    assert [name for name, _ in list_files(Path(data))] == ["part-0", "part-1", "part-2", "part-3"]
    stream = StreamOptions(cache_dir=tmp_path / "cache")
    for lf, rf in zip(local, remote, strict=True):
        with open_file(rf, stream) as f:
            assert f.read() == Path(lf.url).read_bytes()
    assert local_path(f"file://{data}/part-1") == data / "part-1"  # file:// is local, not cached
    # A second reader (a restart) finds every file in the cache: no request for their bytes.
    again = FileSet(files_of("s3://bucket/list"), stream)
    assert [again.read_bytes(k) for k in range(len(again))] == [Path(f.url).read_bytes() for f in local]
    assert again.cache.fetched == 0


def test_the_cache_keeps_to_its_limit_dropping_the_least_recently_read(s3_env, data, tmp_path):
    _upload(data, "s3://bucket/lru")
    files = FileSet(
        files_of("s3://bucket/lru", recursive=False), StreamOptions(cache_dir=tmp_path / "c", cache_limit=2500)
    )
    first, second = files.local(0), files.local(1)
    os.utime(first, ns=(1, 1))  # read long ago
    os.utime(second, ns=(2, 2))
    files.read_bytes(1)  # read again: now the most recent
    files.local(2)  # 3003 bytes > 2500: evicted down to 90% of the limit
    assert not first.exists() and files.cached(1) and files.cached(2) and not files.cached(0)
    assert files.cache.held_bytes() <= 2500
    assert files.read_bytes(0) == bytes([0]) * 1000  # an evicted file is fetched again


_READER = """
import json, sys
from stoker.data.stream import FileSet, StreamOptions, files_of
files = FileSet(files_of(sys.argv[1]), StreamOptions(cache_dir=sys.argv[2]))
files.ahead(range(len(files)))
data = [files.read_bytes(k).hex()[:8] for k in reversed(range(len(files)))]
print(json.dumps({"fetched": files.cache.fetched, "data": data}))
"""


def test_threads_sharing_a_cache_fetch_each_file_once(s3_env, data, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    _upload(data, "s3://bucket/threads")
    readers = [FileSet(files_of("s3://bucket/threads"), StreamOptions(cache_dir=tmp_path / "c")) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda f: [f.read_bytes(k) for k in range(len(f))], readers))
    assert sum(r.cache.fetched for r in readers) == 5 and all(g == got[0] for g in got)


@pytest.mark.slow  # four interpreters importing torch: ~25 s on a loaded machine
def test_processes_sharing_a_cache_fetch_each_file_once(s3_env, data, tmp_path):
    _upload(data, "s3://bucket/shared")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args = [sys.executable, "-c", _READER, "s3://bucket/shared", str(tmp_path / "shared-cache")]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(r["fetched"] for r in results) == 5  # every file once, whoever fetched it
    assert len({tuple(r["data"]) for r in results}) == 1
    names = os.listdir(tmp_path / "shared-cache" / "files")
    assert not [n for n in names if ".tmp-" in n]  # no partial copy left behind


def test_a_missing_or_changed_object_is_an_error_naming_it(s3_env, data, tmp_path):
    _upload(data, "s3://bucket/gone")
    with pytest.raises(DataError, match=r"s3://bucket/nothing-here does not exist"):
        files_of("s3://bucket/nothing-here")
    stream = StreamOptions(cache_dir=tmp_path / "c", retry=FAST_RETRY)
    files = FileSet(files_of("s3://bucket/gone", recursive=False), stream)
    fsspec.filesystem("s3").rm_file("bucket/gone/part-2")
    with pytest.raises(StorageError, match=r"cannot read s3://bucket/gone/part-2: FileNotFoundError"):
        files.read_bytes(2)
    fsspec.filesystem("s3").pipe_file("bucket/gone/part-3", b"short")  # replaced after listing
    with pytest.raises(
        StorageError, match=r"cannot read s3://bucket/gone/part-3 after 2 attempts: .*got 5 of its 1003 bytes"
    ):
        files.read_bytes(3)
    assert not [n for n in os.listdir(ShardCache(stream).files_dir) if ".tmp-" in n]


def test_a_transient_fault_is_retried_with_backoff(s3_env, data, tmp_path, monkeypatch, caplog):
    from stoker.data.stream import cache

    _upload(data, "s3://bucket/flaky")
    real, calls = cache._download, []

    def flaky(file, tmp):  # noqa: ANN001, ANN202
        calls.append(file.url)
        if len(calls) == 1:
            tmp.write_bytes(b"partial")  # the connection drops mid-transfer
            raise ConnectionResetError("connection reset by peer")
        return real(file, tmp)

    monkeypatch.setattr(cache, "_download", flaky)
    stream = StreamOptions(cache_dir=tmp_path / "c", retry=RetryPolicy(attempts=3, backoff=0.01))
    files = FileSet(files_of("s3://bucket/flaky/part-1"), stream)
    with caplog.at_level("WARNING", logger="stoker"):
        assert files.read_bytes(0) == bytes([1]) * 1001
    assert calls == ["s3://bucket/flaky/part-1"] * 2
    assert (
        "read s3://bucket/flaky/part-1 failed (ConnectionResetError: connection reset by peer); retry 1 of 2"
        in caplog.text
    )
