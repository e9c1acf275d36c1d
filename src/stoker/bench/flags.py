"""tf_cnn_benchmarks' flags beyond the core ones, as a declarative table.

Every flag of ``benchmark_cnn.py`` is accounted for: the core flags are declared in
``cli.py`` (grouped for ``--help``); the rest are :class:`Flag` rows here. A row is either

- **implemented** (``note`` is ``None``): its value becomes the ``BenchConfig`` field of the
  same name, and the code that reads that field gives it its meaning; or
- **noted** (``note`` is set): accepted, type-checked (and checked against ``choices``), and,
  when given, reported by a one-line ``Note: --flag=value has no effect here: <why>`` in the run
  header. Nothing is dropped silently.

``tests/bench/test_bench_flags.py`` walks the seed's list of flag names and fails on any flag that
is neither declared in ``cli.py`` nor a row here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Types a row may have: bool (absl style: --flag, --noflag, --flag=true|false), int, float,
#: str, and list (comma-separated, as absl's DEFINE_list).
FLAG_TYPES: tuple[str, ...] = ("bool", "int", "float", "str", "list")


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One tf_cnn_benchmarks flag: its name, type, default, help, allowed values, and either no
    note (implemented: a ``BenchConfig`` field of the same name) or the note saying why it
    has no effect here."""

    name: str
    type: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    note: str | None = None

    @property
    def implemented(self) -> bool:
        return self.note is None


def _f(
    name: str, type: str, default: Any, help: str, *, choices: tuple[str, ...] | None = None, note: str | None = None
) -> Flag:
    return Flag(name=name, type=type, default=default, help=help, choices=choices, note=note)


_TF_GRAPH = "there is no TensorFlow graph or session here; PyTorch runs eagerly (or through torch.compile)"
_TF_CLUSTER = (
    "TensorFlow's cluster flags do not apply: launch processes with torchrun (--nnodes, --node_rank, "
    "--rdzv_endpoint) or --num_gpus"
)
_TF_ALLREDUCE = (
    "gradients are all-reduced by DDP's buckets (see --gradient_repacking), not TensorFlow's all-reduce specs"
)
_KMP = "stoker uses torch's OpenMP runtime; set its environment (OMP_*, KMP_* for Intel's) before starting Python"
_TFRECORD = "the image-folder and CIFAR-10 sources read files by index, not interleaved TFRecord shards"

# fmt: off
TABLE: tuple[Flag, ...] = (
    # ---------------------------------------------------------------- implemented
    _f("eval_batch_size", "int", 0, "evaluation batch size per device (0: --batch_size)"),
    _f("num_eval_epochs", "float", None, "epochs of evaluation data per evaluation, instead of --num_eval_batches"),
    _f("eval_during_training_every_n_epochs", "float", None, "evaluate every N epochs of training"),
    _f("eval_during_training_at_specified_steps", "list", (), "evaluate at these timed steps (comma-separated)"),
    _f("eval_during_training_at_specified_epochs", "list", (), "evaluate at these epochs (comma-separated)"),
    _f("batch_group_size", "int", 1, "batches the input pipeline prepares per group (the infeed's prefetch depth)"),
    _f("display_perf_ewma", "float", None, "progress lines show an exponentially weighted moving average of "
       "images/sec with this weight on the newest step (0 < w <= 1)"),
    _f("distortions", "bool", False, "real-image training: tf_cnn's colour distortions on top of its random "
       "crop and flip (off by default, as in TF 2's tf_cnn: crop and flip only)"),
    _f("resize_method", "str", "bilinear", "resizing of image-folder images",
       choices=("bilinear", "nearest", "bicubic", "area", "round_robin", "crop")),
    _f("use_datasets", "bool", True, "decode real data in workers (false: in the training process)"),
    _f("datasets_use_prefetch", "bool", True, "prepare batches ahead in the infeed's thread"),
    _f("datasets_prefetch_buffer_size", "int", 1, "batches prepared ahead per device"),
    _f("datasets_num_private_threads", "int", None,
       "workers decoding real data (default: one per usable core; --data_worker_kind says of which kind)"),
    _f("datasets_repeat_cached_sample", "bool", False, "read one batch of the real data and repeat it forever"),
    _f("gradient_repacking", "int", 0, "all-reduce the gradients in N DDP buckets of equal size (0: DDP's 25 MB)"),
    _f("xla", "bool", False, "torch.compile the model (TensorFlow: XLA auto-jit)"),
    _f("xla_compile", "bool", False, "torch.compile the whole training step (TensorFlow: compile the graph with XLA)"),
    _f("fp16_vars", "bool", False, "with fp16, keep the weights in fp16 too (no fp32 master copy)"),
    _f("summary_verbosity", "int", 0, "TensorBoard summaries in --train_dir: 1 scalars (loss, learning rate, "
       "images/sec), 2 also histograms of the weights, 3 also of the gradients"),
    _f("save_summaries_steps", "int", 0, "write summaries every N steps (0: none)"),
    _f("ml_perf", "bool", False, "MLPerf :::MLLOG lines (to --train_dir/mlperf.log, else standard output)"),
    _f("loss_type_to_report", "str", "total_loss", "total_loss (with the L2 term) or base_loss (without)",
       choices=("total_loss", "base_loss")),
    _f("benchmark_log_dir", "str", None, "write benchmark_run.log and metric.log (JSON lines) into this folder"),
    _f("benchmark_test_id", "str", None, "a test id recorded in --benchmark_log_dir's files and the results file"),
    _f("gpu_indices", "str", "", "CUDA device of each replica, comma-separated (default 0..N-1)"),
    _f("gpu_memory_frac_for_testing", "float", 0.0, "CUDA: cap this process's memory at this fraction "
       "(torch.cuda.set_per_process_memory_fraction); 0: no cap"),
    _f("resnet_base_lr", "float", None, "ResNet models: the learning rate at batch 256, scaled with the batch"),
    # ---------------------------------------------------------------- accepted, with a note
    _f("local_parameter_device", "str", "gpu", "where a parameter server keeps variables",
       choices=("cpu", "gpu", "CPU", "GPU"),
       note="every replica keeps its own copy of the weights on its device; DDP averages the gradients"),
    _f("variable_consistency", "str", "strong", "strong or relaxed variable updates", choices=("strong", "relaxed"),
       note="updates are always applied before the next step (strong); relaxed staging has no PyTorch counterpart"),
    _f("freeze_when_forward_only", "bool", False, "freeze the graph in forward-only mode",
       note="forward-only already runs without gradients in inference mode; there is no graph to freeze"),
    _f("collect_eval_results_async", "bool", False, "post-process evaluation results in another process",
       note="evaluation results are reduced on the device and read once; there is nothing to post-process"),
    _f("autotune_threshold", "int", None, "autotune threshold of the models",
       note="TensorFlow's per-model autotuning; PyTorch picks kernels itself (cuDNN/oneDNN heuristics)"),
    _f("input_preprocessor", "str", "default", "name of the input preprocessor",
       note="stoker.data's image sources are the only preprocessing (see --distortions, --resize_method)"),
    _f("gpu_thread_mode", "str", "gpu_private", "how GPU host work is assigned to threads",
       note="TensorFlow's GPU thread pools; PyTorch launches kernels from the training thread"),
    _f("per_gpu_thread_count", "int", 0, "threads per GPU",
       note="TensorFlow's GPU thread pools; PyTorch launches kernels from the training thread"),
    _f("hierarchical_copy", "bool", False, "hierarchical gradient copies (DGX-1)", note=_TF_ALLREDUCE),
    _f("compact_gradient_transfer", "bool", True, "compact gradients for transfer", note=_TF_ALLREDUCE),
    _f("use_numa_affinity", "bool", False, "bind threads to NUMA nodes",
       note="start the process under numactl (or torchrun --numa-binding) instead"),
    _f("use_chrome_trace_format", "bool", True, "trace file format",
       note="--trace_file is always a Chrome trace (torch.profiler)"),
    _f("tfprof_file", "str", None, "tfprof profile output",
       note="tfprof is TensorFlow's; use --trace_file (torch.profiler's Chrome trace)"),
    _f("graph_file", "str", None, "write the graph",
       note=_TF_GRAPH + "; `stoker export` writes a torch.export program"),
    _f("partitioned_graph_file_prefix", "str", None, "write the partitioned graphs", note=_TF_GRAPH),
    _f("use_unified_memory", "bool", None, "CUDA unified memory",
       note="PyTorch's CUDA caching allocator does not use unified memory"),
    _f("timestamped_allocator", "bool", False, "TensorFlow's timestamped GPU allocator",
       note="a TensorFlow allocator option; PyTorch's caching allocator orders frees by streams"),
    _f("gpu_kt_max_interval", "int", 0, "GPU kernel tracker", note="a TensorFlow allocator option"),
    _f("gpu_kt_max_bytes", "int", 0, "GPU kernel tracker", note="a TensorFlow allocator option"),
    _f("gpu_kt_max_pending", "int", 0, "GPU kernel tracker", note="a TensorFlow allocator option"),
    _f("use_tf_layers", "bool", True, "build models with tf.layers",
       note="the zoo models are torch.nn modules"),
    _f("debugger", "str", None, "TensorFlow debugger",
       note="tfdbg is TensorFlow's; use pdb or torch.autograd's anomaly mode"),
    _f("use_python32_barrier", "bool", False, "threading.Barrier of Python 3.2",
       note="there are no per-GPU Python threads to synchronise"),
    _f("datasets_use_caching", "bool", False, "cache the compressed input in memory",
       note="the OS page cache keeps image files in memory; there is no compressed-record cache"),
    _f("datasets_parallel_interleave_cycle_length", "int", None, "TFRecord interleave", note=_TFRECORD),
    _f("datasets_sloppy_parallel_interleave", "bool", False, "TFRecord interleave", note=_TFRECORD),
    _f("datasets_parallel_interleave_prefetch", "int", None, "TFRecord interleave", note=_TFRECORD),
    _f("winograd_nonfused", "bool", True, "cuDNN non-fused Winograd convolutions",
       note="PyTorch lets cuDNN choose its convolution algorithms"),
    _f("sync_on_finish", "bool", False, "synchronise the devices at the end",
       note="every run already ends with the device synchronised (the last loss is read)"),
    _f("staged_vars", "bool", False, "stage variables in a staging area",
       note="weights live on the device; nothing is staged between steps"),
    _f("force_gpu_compatible", "bool", False, "pinned host tensors",
       note="the infeed already pins host batches before copying them to a CUDA device"),
    _f("allow_growth", "bool", None, "grow GPU memory on demand",
       note="PyTorch's caching allocator always grows on demand"),
    _f("fuse_decode_and_crop", "bool", True, "fuse JPEG decoding and cropping",
       note="stoker always decodes only the crop window where its libjpeg-crop decoder builds, "
       "else the whole image at the smallest DCT scale the crop allows (see docs/data.md)"),
    _f("distort_color_in_yiq", "bool", True, "colour distortions in YIQ space",
       note="--distortions uses TF 2's RGB/HSV colour ops (TF 2 removed the YIQ variant)"),
    _f("enable_optimizations", "bool", True, "grappler graph optimisations", note=_TF_GRAPH),
    _f("rewriter_config", "str", None, "grappler rewriter configuration", note=_TF_GRAPH),
    _f("single_l2_loss_op", "bool", False, "one L2 loss op over all variables",
       note="the L2 value is always one fused norm over all parameters"),
    _f("use_resource_vars", "bool", False, "resource variables", note="TensorFlow variables only; PyTorch has tensors"),
    _f("compute_lr_on_cpu", "bool", False, "compute the learning rate on the CPU",
       note="the learning rate is always computed on the host (a Python float per step)"),
    _f("sparse_to_dense_grads", "bool", False, "densify sparse gradients",
       note="the image models have no sparse gradients"),
    _f("mkl", "bool", False, "Intel MKL settings", note=_KMP),
    _f("kmp_blocktime", "int", 0, "KMP_BLOCKTIME", note=_KMP),
    _f("kmp_affinity", "str", "granularity=fine,verbose,compact,1,0", "KMP_AFFINITY", note=_KMP),
    _f("kmp_settings", "int", 1, "KMP_SETTINGS", note=_KMP),
    _f("all_reduce_spec", "str", None, "all-reduce algorithm", note=_TF_ALLREDUCE),
    _f("agg_small_grads_max_bytes", "int", 0, "aggregate small gradients", note=_TF_ALLREDUCE),
    _f("agg_small_grads_max_group", "int", 10, "aggregate small gradients", note=_TF_ALLREDUCE),
    _f("allreduce_merge_scope", "int", 1, "merge all-reduces", note=_TF_ALLREDUCE),
    _f("job_name", "str", "", "cluster role", choices=("ps", "worker", "controller", ""), note=_TF_CLUSTER),
    _f("ps_hosts", "str", "", "parameter server hosts", note=_TF_CLUSTER),
    _f("worker_hosts", "str", "", "worker hosts", note=_TF_CLUSTER),
    _f("controller_host", "str", None, "controller host", note=_TF_CLUSTER),
    _f("task_index", "int", 0, "task index", note=_TF_CLUSTER),
    _f("server_protocol", "str", "grpc", "server protocol", note=_TF_CLUSTER),
    _f("cross_replica_sync", "bool", True, "synchronous replicas",
       note="replicas are always synchronous (DDP averages every step's gradients)"),
    _f("horovod_device", "str", "", "Horovod all-reduce device", note="Horovod is not used; DDP all-reduces"),
    _f("eval_dir", "str", "/tmp/tf_cnn_benchmarks/eval", "where evaluation event logs go",
       note="evaluation results are printed, and written to --results_file and with summaries to --train_dir"),
    _f("backbone_model_path", "str", None, "pretrained backbone checkpoint",
       note="TensorFlow checkpoints cannot be loaded; the zoo builds models from their random initialisation"),
    _f("trt_mode", "str", "", "TensorRT precision", choices=("", "FP32", "FP16", "INT8"),
       note="TensorRT conversion is TensorFlow's; export with `stoker export` and convert the program outside"),
    _f("trt_max_workspace_size_bytes", "int", 4 << 30, "TensorRT workspace",
       note="TensorRT conversion is TensorFlow's"),
)
# fmt: on

BY_NAME: Mapping[str, Flag] = {flag.name: flag for flag in TABLE}
IMPLEMENTED: tuple[Flag, ...] = tuple(f for f in TABLE if f.implemented)
NOTED: tuple[Flag, ...] = tuple(f for f in TABLE if not f.implemented)


def format_value(value: Any) -> str:
    """A flag value as it is written on a command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def note_lines(given: Sequence[tuple[str, str]]) -> list[str]:
    """The header's ``Note:`` lines of the noted flags that were given, as ``(name, value)``."""
    return [f"Note: --{name}={value} has no effect here: {BY_NAME[name].note}" for name, value in given]


__all__ = ["BY_NAME", "FLAG_TYPES", "IMPLEMENTED", "NOTED", "TABLE", "Flag", "format_value", "note_lines"]
