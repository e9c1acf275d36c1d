"""``stoker bench``: a tf_cnn_benchmarks-compatible benchmark harness built on the Estimator.

Same flags, modes and output as tf_cnn_benchmarks' ``benchmark_cnn.py`` (training,
forward-only, evaluation, training + evaluation), plus an inference latency benchmark, FLOP
counts and MFU. The pieces:

- ``config``: :class:`BenchConfig`, the validated settings of one run (``settings``: one field
  per flag; ``flags``: how flags are declared, parsed and named in the engine's messages);
- ``workload``: what the settings mean on this machine (data, device, step counts);
- ``plan``: :class:`BenchPlan`, the run worked out once: the ``RunConfig``, the workload, the
  bench's own choices (threads, what decodes real data, the peak) and the ``input_fn`` s; the
  engine's choices are the Estimator's record (``Estimator.choices``), which the header prints;
- ``optim``: tf_cnn_benchmarks' optimizers and learning-rate schedules;
- ``model``: the zoo model the flags name and tf_cnn_benchmarks' classification ``model_fn``;
- ``train`` / ``inference``: the runners; they return dicts and stream progress lines;
- ``stats``: speed and latency statistics and their text lines;
- ``report``: header, summary, MFU, results files, the model table;
- ``run_spec``: the ``run_spec.json`` kind ``zoo`` that ``--train_dir`` records, and its
  builder for ``stoker export``;
- ``cli``: the ``stoker bench`` flags.

The harness sits above the engine: it may import any of stoker but the recipes, AdaNet,
serving and the ``stoker`` command, and nothing below it imports the harness.

In Python::

    from stoker.bench import BenchConfig, run_benchmark, summary_lines

    result = run_benchmark(BenchConfig(model="resnet20", data_name="cifar10", num_batches=20))
    print("\\n".join(summary_lines(result)))
"""

from ..errors import FlagError
from .config import BenchConfig
from .inference import run_inference
from .plan import BenchPlan, build_plan
from .report import (
    add_efficiency,
    header_lines,
    measure_matmul_peak,
    model_table,
    summary_lines,
    write_results,
)
from .stats import LatencyStats, PerfTiming, latency_stats, perf_timing
from .train import bench_model_fn, run_benchmark
from .workload import Workload, resolve_workload

__all__ = [
    "BenchConfig",
    "FlagError",
    "BenchPlan",
    "LatencyStats",
    "PerfTiming",
    "Workload",
    "add_efficiency",
    "bench_model_fn",
    "build_plan",
    "header_lines",
    "latency_stats",
    "measure_matmul_peak",
    "model_table",
    "perf_timing",
    "resolve_workload",
    "run_benchmark",
    "run_inference",
    "summary_lines",
    "write_results",
]
