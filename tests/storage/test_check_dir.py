"""A model_dir (or a CLI's --model_dir, --train_dir, --out) that cannot be used is refused in one
line naming it, before anything runs or is written: a file, a path under a file, a folder this
user cannot write, a read-only mount (real ones: permissions dropped, a read-only tmpfs) and an
object-store URL whose bucket does not exist."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_main
from helpers.processes import python_env
from helpers.tiny import make_estimator
from stoker import storage
from stoker.bench.config import BenchConfig, FlagError
from stoker.errors import ConfigError


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    return path


def _untouched(tmp_path: Path, a_file: Path) -> None:
    """Nothing was created or changed: the folder holds the file alone, with its text."""
    assert sorted(p.name for p in tmp_path.iterdir()) == [a_file.name] and a_file.read_text() == "keep me"


def test_a_model_dir_that_is_a_file_is_one_line_naming_model_dir(tmp_path, a_file):
    with pytest.raises(ConfigError) as e:
        make_estimator(a_file)
    assert str(e.value) == (
        f"model_dir {str(a_file)!r} is a file, not a directory; give a directory (created if missing)"
    )
    assert e.value.__cause__ is None and e.value.__context__ is None  # no chained traceback
    _untouched(tmp_path, a_file)


def test_a_model_dir_under_a_file_is_one_line_naming_the_file(tmp_path, a_file):
    with pytest.raises(ConfigError) as e:
        make_estimator(a_file / "runs" / "a")
    assert str(e.value) == (
        f"model_dir {str(a_file / 'runs' / 'a')!r} cannot be created: {str(a_file)!r} is a file, not a directory"
    )
    _untouched(tmp_path, a_file)


def test_usable_directories_pass_and_nothing_is_created(tmp_path):
    storage.check_dir(tmp_path, "model_dir")  # exists
    storage.check_dir(tmp_path / "new" / "deeper", "model_dir")  # created later, by the run
    storage.check_dir("memory://bucket/run", "model_dir")  # no buckets there
    assert list(tmp_path.iterdir()) == []


def test_readers_accept_a_read_only_directory_but_not_a_file(tmp_path, a_file, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as if nothing were writable
    storage.check_dir(tmp_path, "MODEL_DIR", writable=False)
    with pytest.raises(ConfigError, match=r"^MODEL_DIR '.*notes.txt' is a file, not a directory$"):
        storage.check_dir(a_file, "MODEL_DIR", writable=False)
    with pytest.raises(ConfigError, match=r"^model_dir '.*' is not writable by this user; give a writable directory$"):
        storage.check_dir(tmp_path, "model_dir")


def test_bench_train_dir_that_is_a_file_is_a_flag_error(tmp_path, a_file):
    with pytest.raises(FlagError) as e:
        BenchConfig(train_dir=str(a_file))
    assert e.value.flags == ("train_dir",)
    assert str(e.value) == (
        f"--train_dir {str(a_file)!r} is a file, not a directory; give a directory (created if missing)"
    )
    with pytest.raises(FlagError, match=r"^--benchmark_log_dir '.*notes.txt/logs' cannot be created: "):
        BenchConfig(benchmark_log_dir=str(a_file / "logs"))


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["bench", "--model=trivial", "--num_batches=1", "--train_dir={f}"], "--train_dir"),
        (["train", "charlm", "--model_dir={f}"], "--model_dir"),
        (["adanet", "digits", "--model_dir={f}"], "--model_dir"),
        (["evaluate", "{f}"], "MODEL_DIR"),
        (["export", "{f}", "--out", "{d}/export"], "MODEL_DIR"),
        (["export", "{d}", "--out", "{f}"], "--out"),
        (["inspect", "{f}"], "MODEL_DIR"),
    ],
    ids=["bench", "train", "adanet", "evaluate", "export", "export-out", "inspect"],
)
def test_each_cli_exits_2_before_printing_anything(capsys, tmp_path, a_file, argv, flag):
    code, out, err = run_main(capsys, *(a.format(f=a_file, d=tmp_path) for a in argv))
    assert code == 2 and out == ""  # no header, no progress
    first = err.splitlines()[0]
    assert first == f"stoker {argv[0]}: error: {flag} {str(a_file)!r} is a file, not a directory" + (
        "" if flag == "MODEL_DIR" else "; give a directory (created if missing)"
    )
    _untouched(tmp_path, a_file)


# ---------------------------------------------------------------------------- real permissions
_SCRIPT = (
    "import sys; sys.path.insert(0, 'tests'); from helpers.tiny import make_estimator; make_estimator(sys.argv[1])"
)


def _without_root(command: list[str]) -> list[str]:
    """``command`` run without root's power to write anywhere (capsh drops it), or as is for a user."""
    if os.geteuid() != 0:
        return command
    if shutil.which("capsh") is None:
        pytest.skip("running as root without capsh: no way to drop the right to write anywhere")
    return ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", shlex.join(command)]


def _on_read_only_mount(folder: Path, command: list[str]) -> list[str]:
    """``command`` run where ``folder`` is a read-only tmpfs (a private mount namespace)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a read-only tmpfs needs root and unshare")
    mount = f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(folder))} && exec {shlex.join(command)}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(command, env=python_env(), cwd=root, capture_output=True, text=True, timeout=300)


def test_an_unwritable_folder_is_refused_in_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    done = _run(_without_root([sys.executable, "-c", _SCRIPT, str(locked / "run")]))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"stoker.errors.ConfigError: model_dir {str(locked / 'run')!r} cannot be created: "
        f"{str(locked)!r} is not writable by this user; give a writable directory"
    )
    assert list(locked.iterdir()) == []
    bench = _run(_without_root([sys.executable, "-m", "stoker", "bench", "--model=trivial", f"--train_dir={locked}"]))
    assert (bench.returncode, bench.stdout) == (2, "")
    assert bench.stderr.splitlines()[0] == (
        f"stoker bench: error: --train_dir {str(locked)!r} is not writable by this user; give a writable directory"
    )


def test_a_read_only_mount_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "mnt"
    folder.mkdir()
    done = _run(_on_read_only_mount(folder, [sys.executable, "-c", _SCRIPT, str(folder)]))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        f"stoker.errors.ConfigError: model_dir {str(folder)!r} is on a read-only file system; give a writable directory"
    )
    train = [sys.executable, "-m", "stoker", "train", "charlm", f"--model_dir={folder}/run"]
    done = _run(_on_read_only_mount(folder, train))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[0] == (
        f"stoker train: error: --model_dir {str(folder / 'run')!r} cannot be created: {str(folder)!r} "
        "is on a read-only file system; give a writable directory"
    )


# ---------------------------------------------------------------------------- object stores
def test_a_bucket_that_does_not_exist_is_named_before_training(s3_env):
    import fsspec

    with pytest.raises(ConfigError) as e:
        make_estimator("s3://no-such-bucket/run")
    assert str(e.value) == (
        "model_dir 's3://no-such-bucket/run': the bucket 'no-such-bucket' does not exist "
        "(or these credentials cannot see it); create it first"
    )
    assert not fsspec.filesystem("s3").exists("no-such-bucket")
    make_estimator("s3://bucket/run")  # the fixture's bucket exists
