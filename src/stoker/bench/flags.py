"""Every ``stoker bench`` flag, declared once; the parser, the notes and the docs' lists are made from it.

A flag is declared in exactly one place:

- a flag that sets a setting is a ``BenchConfig`` field (declared in ``bench/settings.py``) made
  with the one flag helper of every command, :func:`stoker.flags.option`: its default is the
  field's, its type the field's annotation, and its :class:`~stoker.flags.Flag` carries the
  help, the ``--help`` group (one of :data:`GROUPS`), the allowed values and the range;
- a flag tf_cnn_benchmarks has but that has no effect in PyTorch is a row of :data:`NOTED`
  here, with the note saying why (no field: nothing reads it);
- the two flags that are spellings of other settings (``--use_fp16``, ``--list_models``) are
  rows of :data:`COMMAND_ONLY`.

``stoker bench`` parses in the helper's ``absl`` style (tf_cnn_benchmarks' booleans ``--flag``,
``--noflag``, ``--flag=true``). Here, too: :func:`note_lines` writes the header's ``Note: --flag=value
has no effect here: <why>`` lines, :func:`markdown_tables` writes docs/bench-reference.md's flag
lists (``tests/bench/test_bench_flags.py`` checks that the page holds exactly them, and that every
flag of tf_cnn_benchmarks is declared), and :data:`FLAG_OF_FIELD` / :class:`FlagNames` say the
engine's reasons and errors, which name ``RunConfig`` fields, in flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import FlagError
from ..flags import Flag, check_value, field_flags, format_value
from ..resolve import Names, spelled

# --help groups, in their order
RUN = "what to run"
AMOUNT = "how much"
WHERE = "where and how"
INPUT = "real data"
OPTIMIZER = "optimizer and learning rate"
EVALUATION = "evaluation during training"
OUTPUTS = "checkpoints, traces, results"
INFERENCE = "inference latency (--mode=inference)"
MORE = "more tf_cnn_benchmarks flags"
NOTED_GROUP = "accepted with a note: no effect in PyTorch (the run says why)"
GROUPS: tuple[str, ...] = (RUN, AMOUNT, WHERE, INPUT, OPTIMIZER, EVALUATION, OUTPUTS, INFERENCE, MORE, NOTED_GROUP)


def note_lines(given: Sequence[tuple[str, str]]) -> list[str]:
    """The header's ``Note:`` lines of the noted flags that were given, as ``(name, value)``."""
    return [f"Note: --{name}={value} has no effect here: {BY_NAME[name].note}" for name, value in given]


# ------------------------------------------------------------------------------ the engine's words in flags
#: The flag of each ``RunConfig`` field the bench sets (and of the one rule argument it passes,
#: ``gpu_indices``): the engine's reasons and errors name fields, the bench's output names flags.
FLAG_OF_FIELD: dict[str, str] = {
    "model_dir": "train_dir",
    "seed": "tf_random_seed",
    "iterations_per_loop": "iterations_per_loop",
    "save_checkpoints_steps": "save_model_steps",
    "save_checkpoints_secs": "save_model_secs",
    "keep_checkpoint_max": "max_ckpts_to_keep",
    "precision": "precision",
    "loss_scale": "fp16_loss_scale",
    "device": "device",
    "gpu_indices": "gpu_indices",
    "compile": "compile",
    "cuda_graph": "cuda_graph",
    "fast_linear": "fast_linear",
    "sgd_in_backward": "sgd_in_backward",
    "strategy": "variable_update",
    "ddp_bucket_cap_mb": "gradient_repacking",
    "prefetch_depth": "datasets_prefetch_buffer_size",
}


class FlagNames(Names):
    """The engine's settings said as ``stoker bench``'s flags (``--device=cpu``); a field the
    bench has no flag for keeps its ``RunConfig`` name. Records the flags it named."""

    def __init__(self) -> None:
        self.named: list[str] = []

    def field(self, name: str) -> str:
        flag = FLAG_OF_FIELD.get(name)
        if flag is None:
            return super().field(name)
        self.named.append(flag)
        return f"--{flag}"

    def value(self, value: object) -> str:
        return format_value(value)


def flag_error(error: Exception) -> FlagError:
    """The engine's refusal of a setting (a ``ConfigError``), said in flags and naming them."""
    names = FlagNames()
    message = spelled(error, names)
    return FlagError(tuple(dict.fromkeys(names.named)), message)


# ------------------------------------------------------------------------------ the docs
def markdown_tables(flags: Sequence[Flag]) -> str:
    """docs/bench-reference.md's flag lists: one table per ``--help`` group (a noted flag's row: its note)."""
    parts = []
    for group in GROUPS:
        rows = [f for f in flags if f.group == group]
        if not rows:
            continue
        if group == NOTED_GROUP:
            head = ["| Flag | Why it has no effect in PyTorch |", "|---|---|"]
            lines = [f"| `--{f.name}` | {_cell(str(f.note))} |" for f in rows]
        else:
            head = ["| Flag | Default | Meaning |", "|---|---|---|"]
            lines = [
                f"| `--{f.name}` | {_cell(f.default_text or format_value(f.default) or '(empty)')} | "
                f"{_cell(f.help)}{'. ' + f.docs if f.docs else ''} |"  # docs: Markdown already
                for f in rows
            ]
        parts.append("\n".join([f"### {group[0].upper()}{group[1:]}", "", *head, *lines]))
    return "\n\n".join(parts) + "\n"


def _cell(text: str) -> str:
    """Text as a Markdown table cell: no HTML tags (``<class>``), no emphasis (``train-*-of-*``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


# ------------------------------------------------------------------------------ rows without a field
def _f(name: str, kind: str, tf_default: Any, help: str, *, note: str, choices: tuple[str, ...] | None = None) -> Flag:
    """A noted row: tf_cnn_benchmarks' ``tf_default`` is kept for the record; nothing reads the value."""
    return Flag(name=name, kind=kind, default=tf_default, help=help, group=NOTED_GROUP, choices=choices, note=note)


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

#: tf_cnn_benchmarks' flags accepted with a note: given, each prints
#: ``Note: --flag=value has no effect here: <note>`` in the run header (their values are still
#: checked: type and choices).
# fmt: off
NOTED: tuple[Flag, ...] = (
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

#: Flags that are another spelling of a setting, or an action: no field of their own.
COMMAND_ONLY: tuple[Flag, ...] = (
    Flag(
        name="list_models",
        kind="bool",
        default=False,
        group=RUN,
        help="print every registered model (filtered by --data_name) with its parameters and GFLOP per "
        "example, then exit",
    ),
    Flag(
        name="use_fp16",
        kind="bool",
        default=False,
        group=WHERE,
        help="same as --precision=fp16 (contradicts any other --precision)",
    ),
)

BY_NAME: dict[str, Flag] = {flag.name: flag for flag in NOTED + COMMAND_ONLY}


def all_flags(config_class: type) -> tuple[Flag, ...]:
    """Every flag: ``config_class``'s fields, the command-only rows and the noted rows."""
    return (*field_flags(config_class), *COMMAND_ONLY, *NOTED)


def check_noted(given: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The noted flags among ``given`` (a parsed namespace's values), checked (type and choices),
    as ``(name, value)`` for their ``Note:`` lines."""
    noted = [flag for flag in NOTED if flag.name in given]
    for flag in noted:
        check_value(flag, given[flag.name])
    return tuple((flag.name, format_value(given[flag.name])) for flag in noted)


__all__ = [
    "COMMAND_ONLY",
    "FLAG_OF_FIELD",
    "GROUPS",
    "NOTED",
    "FlagNames",
    "all_flags",
    "check_noted",
    "flag_error",
    "markdown_tables",
    "note_lines",
]
