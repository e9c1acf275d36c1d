"""Start-up: what a restarted run repeats before its first step, each part timed in fresh processes.

A restart (issue 49) pays the interpreter, the imports, the per-machine measurements stoker
makes (which JPEG decoder is faster on this data, what fp16 costs here, the peak FLOP/s, the
linear-kernel choices), its C helpers' builds and the TFRecord offset indexes before its first
step. This benchmark times each of them in processes of their own, as a restart meets them,
side by side with what they cost before they were cut or cached:

- **imports** (the process's wall time, bytecode compiled once beforehand as an installed
  package has it): the interpreter alone, ``import torch``, ``import stoker``, every public name,
  ``stoker --help`` / ``bench --help`` / ``train --help``; ``before`` for the public names adds
  back the eager Pillow import this session removed;
- **events file**: a run's first ``ScalarWriter`` (``model_dir/events``), timed in the process,
  now and with the TensorBoard file layer (``tensorflow_stub``, boto3, fsspec) it imported before;
- **first optimizer**: torch imports ``torch._dynamo`` when an optimizer is built (its
  ``add_param_group`` is wrapped in ``torch._disable_dynamo``), compiled or not: timed, not
  stoker's to cut;
- **per-machine figures**: each measured with an empty cache folder (a new machine) and read
  from the folder the first process filled (a restart on the same machine); the decoder probe
  also with the decoder named (no probe at all, the floor);
- **C helper**: building ``libjpeg-crop`` with the system compiler, and loading the built one;
- **TFRecord index**: indexing a shard of 10,000 records, and loading the cached index.

Each case runs ``--rounds`` times, interleaved; the table gives the fastest (the machine is
shared: the minimum is the figure least disturbed by others) and the median, of the wall time
and of the CPU time (user + system), which a loaded machine inflates far less: on a shared
machine compare the CPU columns. Results:
docs/results/startup.md.

    PYTHONPATH=src python benchmarks/startup.py [--rounds 5] [--only imports,figures,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: In-process timers: each prints the seconds of the part it times (the process's own start,
#: interpreter and imports, not counted); ``{data}`` is the benchmark's data folder.
ONE_STEP = """
import time, torch
p = torch.nn.Parameter(torch.zeros(4)); p.grad = torch.ones(4)
t, c = time.perf_counter(), time.process_time()
opt = torch.optim.SGD([p], lr=0.1); opt.step()
print(time.perf_counter() - t, time.process_time() - c)
"""
PILLOW = """
import time, torch
t, c = time.perf_counter(), time.process_time()
import PIL.Image
print(time.perf_counter() - t, time.process_time() - c)
"""
WRITER = """
import time, tempfile
from stoker.summary import ScalarWriter
from tensorboard.compat.proto import event_pb2  # the protos: imported in both, not what differs
t, c = time.perf_counter(), time.process_time()
{extra}
w = ScalarWriter(tempfile.mkdtemp()); w.write(1, {{'loss': 0.5}}); w.close()
print(time.perf_counter() - t, time.process_time() - c)
"""
OLD_WRITER_IMPORTS = (
    "from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import CRC_TABLE; "
    "from tensorboard.summary.writer.event_file_writer import _global_uid"
)
DECODER = """
import time
from stoker.data import ImageOptions, ReadOptions, image_folder
from stoker.data.images import jpeg_crop, decoders
jpeg_crop.available(); decoders.available_decoders()  # the libraries loaded: not the probe
t, c = time.perf_counter(), time.process_time()
image = ImageOptions(image_size=224, decoder={decoder!r})
s = image_folder({data!r} + '/jpegs', read=ReadOptions(batch_size=8), image=image)
print(time.perf_counter() - t, time.process_time() - c)
"""
FP16 = """
import time
from stoker.kernels.fp16_cost import fp16_cost
t, c = time.perf_counter(), time.process_time()
fp16_cost()
print(time.perf_counter() - t, time.process_time() - c)
"""
PEAK = """
import time, torch
from stoker.kernels.peak import measured_peak
t, c = time.perf_counter(), time.process_time()
measured_peak(torch.device('cpu'), 'fp32')
print(time.perf_counter() - t, time.process_time() - c)
"""
LINEAR = """
import time, torch
from stoker.kernels.linear import choose
t, c = time.perf_counter(), time.process_time()
choose(256, 1024, 1024, torch.float32, True)
print(time.perf_counter() - t, time.process_time() - c)
"""
NATIVE = """
import time
from stoker.data.images import jpeg_crop
t, c = time.perf_counter(), time.process_time()
assert jpeg_crop.available(), jpeg_crop.unavailable_reason()
print(time.perf_counter() - t, time.process_time() - c)
"""
INDEX = """
import time
from stoker.data.tfrecord_index import shard_index
t, c = time.perf_counter(), time.process_time()
i = shard_index({data!r} + '/shard.tfrecord')
print(time.perf_counter() - t, time.process_time() - c)
assert len(i) == 10000
"""


def cases(data: Path) -> list[tuple[str, str, str, dict[str, str]]]:
    """(group, case, how, settings): ``how`` is ``wall:<argv as JSON>`` (the process's wall time)
    or ``code:<python>`` (the seconds it prints); settings: ``cache`` = ``fresh`` (an empty cache
    folder each time: a new machine), ``warm`` (the folder an untimed first run of every case
    filled: a restart) or ``fixed`` (the same folder, for cases that do not read it); ``index`` =
    ``fresh`` removes the cached TFRecord index first."""
    py = [sys.executable]
    w = lambda *argv: "wall:" + json.dumps([*py, *argv])  # noqa: E731
    c = lambda code: "code:" + code  # noqa: E731
    api = "import stoker\nfor n in stoker.__all__: getattr(stoker, n)"
    fixed, fresh, warm = {"cache": "fixed"}, {"cache": "fresh"}, {"cache": "warm"}
    return [
        ("imports", "python -c pass", w("-c", "pass"), fixed),
        ("imports", "import torch", w("-c", "import torch"), fixed),
        ("imports", "import stoker", w("-c", "import stoker"), fixed),
        ("imports", "every public name, before (Pillow eager)", w("-c", "import PIL.Image\n" + api), fixed),
        ("imports", "every public name, now", w("-c", api), fixed),
        ("imports", "Pillow's import, in the process (what the public names paid before)", c(PILLOW), fixed),
        ("imports", "stoker --help", w("-m", "stoker", "--help"), fixed),
        ("imports", "stoker bench --help", w("-m", "stoker", "bench", "--help"), fixed),
        ("imports", "stoker train --help", w("-m", "stoker", "train", "--help"), fixed),
        (
            "run",
            "events file opened, before (TensorBoard file layer)",
            c(WRITER.format(extra=OLD_WRITER_IMPORTS)),
            fixed,
        ),
        ("run", "events file opened, now", c(WRITER.format(extra="")), fixed),
        ("run", "first optimizer built and stepped (torch imports torch._dynamo)", c(ONE_STEP), fixed),
        ("figures", "decoder probe, new machine (timed)", c(DECODER.format(data=str(data), decoder="auto")), fresh),
        ("figures", "decoder probe, restart (cached)", c(DECODER.format(data=str(data), decoder="auto")), warm),
        ("figures", "decoder named (no probe)", c(DECODER.format(data=str(data), decoder="libjpeg-crop")), warm),
        ("figures", "fp16 cost, new machine", c(FP16), fresh),
        ("figures", "fp16 cost, restart (cached)", c(FP16), warm),
        ("figures", "peak FLOP/s, new machine", c(PEAK), fresh),
        ("figures", "peak FLOP/s, restart (cached)", c(PEAK), warm),
        ("figures", "fast_linear choice of one shape, new machine", c(LINEAR), fresh),
        ("figures", "fast_linear choice of one shape, restart (cached)", c(LINEAR), warm),
        ("native", "libjpeg-crop built (new machine)", c(NATIVE), fresh),
        ("native", "libjpeg-crop loaded (restart)", c(NATIVE), warm),
        (
            "index",
            "TFRecord index of 10,000 records built",
            c(INDEX.format(data=str(data))),
            {"index": "fresh", **fixed},
        ),
        ("index", "TFRecord index loaded (restart)", c(INDEX.format(data=str(data))), fixed),
    ]


def make_data(data: Path) -> None:
    """32 JPEGs of 500x375 in two class folders (the decoder probe times 16), and one TFRecord
    shard of 10,000 small records."""
    import io

    import numpy as np
    from PIL import Image

    from stoker.data.tfrecord_io import write_tfrecords

    rng = np.random.default_rng(0)
    for c in range(2):
        (data / "jpegs" / f"c{c}").mkdir(parents=True)
        for i in range(16):
            base = rng.integers(0, 256, (47, 63, 3), dtype=np.uint8)  # detail at several scales
            img = Image.fromarray(base).resize((500, 375), Image.BILINEAR)
            noisy = np.clip(np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, (375, 500, 3)), 0, 255)
            buf = io.BytesIO()
            Image.fromarray(noisy.astype(np.uint8)).save(buf, format="JPEG", quality=90)
            (data / "jpegs" / f"c{c}" / f"{i:02d}.jpg").write_bytes(buf.getvalue())
    write_tfrecords(data / "shard.tfrecord", (bytes(rng.integers(0, 256, 200, dtype=np.uint8)) for _ in range(10_000)))


def run_case(how: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds: of the process (``wall:``, its CPU time user + system from
    ``wait4``) or of the part it timed (``code:``, ``perf_counter`` and ``process_time``)."""
    kind, _, what = how.partition(":")
    argv = json.loads(what) if kind == "wall" else [sys.executable, "-c", what]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[-1][:200]!r} failed:\n{err.read()[-3000:]}")
        if kind == "wall":
            return wall, usage.ru_utime + usage.ru_stime
        timed_wall, timed_cpu = out.read().split()[:2]
        return float(timed_wall), float(timed_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", default="", help="groups to run, comma-separated (imports, run, figures, native, index)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stoker-startup-"))
    try:
        data = work / "data"
        make_data(data)
        base = dict(os.environ)
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode compiled once, then reused
        base.update(PYTHONPYCACHEPREFIX=str(work / "pyc"), PYTHONPATH=str(ROOT / "src"))
        todo = [c for c in cases(data) if not args.only or c[0] in args.only.split(",")]
        warm = work / "cache"
        for _, _, how, _ in todo:  # untimed: compiles the bytecode, fills the cache folder as a first run would
            run_case(how, {**base, "STOKER_CACHE_DIR": str(warm)})
        times: dict[str, list[tuple[float, float]]] = {name: [] for _, name, _, _ in todo}
        for r in range(args.rounds):
            for i, (_, name, how, settings) in enumerate(todo):
                cache = work / f"cache-empty-{r}-{i}" if settings["cache"] == "fresh" else warm
                if settings.get("index") == "fresh":
                    shutil.rmtree(data / ".stoker-index", ignore_errors=True)
                times[name].append(run_case(how, {**base, "STOKER_CACHE_DIR": str(cache)}))
        print(f"seconds, {args.rounds} rounds; wall: fastest, median; CPU (user + system): fastest, median")
        print(f"{'':<72} {'wall':>8} {'median':>8} {'CPU':>8} {'median':>8}")
        group = None
        for g, name, _, _ in todo:
            if g != group:
                print(f"[{g}]")
                group = g
            walls, cpus = [t[0] for t in times[name]], [t[1] for t in times[name]]
            print(
                f"  {name:<70} {min(walls):8.3f} {statistics.median(walls):8.3f}"
                f" {min(cpus):8.3f} {statistics.median(cpus):8.3f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
