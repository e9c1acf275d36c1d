"""What a ``BenchConfig`` means on this machine: data set, model shape, device and step counts
(the ``input_fn`` s are :meth:`stoker.bench.plan.BenchPlan.input_fn`'s).

Data:

- **synthetic** (no ``--data_dir``): one random batch generated once on the device and returned
  every step (``stoker.data.synthetic_images``), as tf_cnn_benchmarks' synthetic GPU inputs:
  the benchmark measures the model and the loop, not an input pipeline. Already channels-last
  for ``--data_format=NHWC``. Models of other data sets (MovieLens ids, LibriSpeech
  spectrograms, COCO images with boxes) make their own batch (``ModelInfo.example_batch``);
  those data sets are synthetic only.
- **CIFAR-10 binaries** (``data_batch_*.bin``, ``test_batch.bin``) via ``stoker.data.cifar_binary``.
- **an image folder** (``root/<class>/<image>``; ``root/train`` and ``root/validation`` or
  ``root/val`` when present) via ``stoker.data.image_folder``, decoded in worker processes
  (one per core this process may run on) into uint8 batches in shared memory, with
  tf_cnn_benchmarks' preprocessing: its random crop and flip for training (plus its colour
  distortions with ``--distortions``), its evaluation crop otherwise. The float cast, colour
  distortions and normalisation (to [-1, 1], as tf_cnn's) run in the step, on the device
  (``bench.model.device_images``), so only uint8 bytes cross process and host-to-device
  boundaries.
- **TFRecord shards** in tf_cnn_benchmarks' ImageNet layout (``train-*-of-*``, evaluation from
  ``validation-*-of-*`` when present) via ``stoker.data.imagenet_tfrecords``, decoded the same
  way: picked when the folder holds ``train-*-of-*`` files; a folder holding both shards and
  class folders is refused.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import resolve as rules
from ..data.images import IMAGE_EXTENSIONS, scan_image_folder
from ..data.images.tar_shards import find_tar_shards, split_of
from ..data.images.tfrecord import expected_layouts, shard_files
from ..data.stream import is_folder, list_files
from ..data.tar_io import TarShards
from ..data.tfrecord_index import RecordShards
from ..distributed import device_choice, torchrun_world_size
from ..errors import ConfigError
from ..models import DATASETS, DEFAULT_NUM_CLASSES, EXAMPLES_PER_EPOCH, ModelInfo, get_model_info
from ..models.schedules import LearningRate, describe_learning_rate, learning_rate_schedule
from ..resolve import Choice
from ..storage import Location, location
from .checks import gpu_indices as parse_gpu_indices
from .config import (
    DEFAULT_LEARNING_RATE,
    DEFAULT_NUM_BATCHES,
    FALLBACK_BATCH_SIZE,
    MODE_EVAL,
    MODE_INFERENCE,
    BenchConfig,
    FlagError,
)
from .flags import flag_error
from .inputs import IMAGE_FOLDER, TAR_SHARDS, TFRECORDS, has_class_folders, image_folder_roots

_CIFAR_RECORD_BYTES = 1 + 32 * 32 * 3
_CIFAR_MARKERS = frozenset(("data_batch_1.bin", "test_batch.bin", "cifar-10-batches-bin"))


def _names_in(folder: Location) -> set[str]:
    """The names directly in a local folder or below a URL prefix (files and folders)."""
    if isinstance(folder, Path):
        return set(os.listdir(folder)) if folder.is_dir() else set()
    return {name.split("/", 1)[0] for name, _ in list_files(folder, recursive=True)}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A resolved benchmark: what runs, on which data, where, and for how many steps.

    Attributes:
        dataset: ``imagenet`` or ``cifar10``.
        synthetic: no ``--data_dir``.
        image_size / num_classes: the model's input side and number of logits.
        train_examples / eval_examples: examples per epoch of the training / evaluation data.
        device: the torch device of this process's replica.
        num_devices: replicas (``WORLD_SIZE`` under torchrun, else 1).
        batch_size: the global batch (``--batch_size`` times the replicas).
        num_batches: timed steps (training) or batches (evaluation, forward-only).
        num_epochs: ``num_batches`` in epochs of the data the mode reads.
        eval_batches: batches of an evaluation (``None``: one pass over real evaluation data).
        eval_batch_size: the global batch of evaluations (``--eval_batch_size``, else ``--batch_size``,
            times the replicas); with ``--eval`` it is ``batch_size`` too.
        default_learning_rate: the model's constant rate (used without a rate flag), or ``None``.
        model_rate: the model's rate schedule by global step (used without a rate flag), or ``None``.
        defaults_used: what came from the model's defaults, one phrase each (the header's ``Defaults:``).
        model_info: the registry's entry of ``--model`` (``None`` for a caller's own model).
        data_layout: what an ImageNet ``--data_dir`` holds, ``TFRecord shards`` or ``image folder``
            (the header's ``Dataset:`` line says it); empty for synthetic data and CIFAR-10.
        data_format: ``--data_format``, or when it is left out the model's default on the
            device (:func:`stoker.resolve.data_format`).
    """

    dataset: str
    synthetic: bool
    image_size: int
    num_classes: int
    train_examples: int
    eval_examples: int
    device: torch.device
    num_devices: int
    batch_size: int
    num_batches: int
    num_epochs: float
    eval_batches: int | None
    eval_batch_size: int
    default_learning_rate: float | None = None
    model_rate: LearningRate | None = None
    defaults_used: tuple[str, ...] = ()
    model_info: ModelInfo | None = None
    data_layout: str = ""
    data_format: str = "NCHW"

    @property
    def example(self) -> str:
        """What one example is ("images", "examples", ...), for throughput lines."""
        return self.model_info.example if self.model_info is not None else "images"

    @property
    def per_device_batch_size(self) -> int:
        return self.batch_size // self.num_devices

    @property
    def dataset_label(self) -> str:
        return self.dataset + (
            " (synthetic)" if self.synthetic else f" ({self.data_layout})" if self.data_layout else ""
        )

    @property
    def device_names(self) -> list[str]:
        if self.num_devices == 1:
            return [str(self.device)]
        return [f"{self.device.type}:{i}" for i in range(self.num_devices)]  # one per replica


def device_name(cfg: BenchConfig) -> str:
    """``--device`` as ``RunConfig.device`` takes it (``gpu`` is tf_cnn_benchmarks' ``cuda``)."""
    return "cuda" if cfg.device == "gpu" else cfg.device


def replica_device(cfg: BenchConfig) -> Choice[torch.device]:
    """This replica's device by the engine's one rule (:func:`stoker.distributed.device_choice`:
    ``auto`` is CUDA where torch sees it; replica ``LOCAL_RANK`` takes CUDA device ``LOCAL_RANK``,
    or entry ``LOCAL_RANK`` of ``--gpu_indices``); a device torch cannot use is a flag error."""
    try:
        return device_choice(device_name(cfg), indices=parse_gpu_indices(cfg.gpu_indices))
    except ConfigError as e:
        raise flag_error(e) from None


def guess_data_name(data_dir: str | None, model: str | None = None) -> str:
    """tf_cnn_benchmarks guesses the data set from ``--data_dir``; CIFAR-10 binaries are recognisable.

    A ``model`` registered for one data set only (``ncf``, ``deepspeech2``, ``ssd300``) names it.
    """
    if model is not None:
        homes = [d for d in DATASETS if _registered(model, d)]
        if len(homes) == 1:
            return homes[0]
    if data_dir is not None and _CIFAR_MARKERS.intersection(_names_in(location(data_dir))):
        return "cifar10"
    return "imagenet"


def _registered(model: str, dataset: str) -> bool:
    try:
        get_model_info(model, dataset)
    except ValueError:
        return False
    return True


def _check_task(cfg: BenchConfig, info: ModelInfo, synthetic: bool) -> None:
    """What a model that is not an image classifier cannot do here."""
    if info.is_classifier:
        return
    if not synthetic:
        raise FlagError(
            ("data_dir", "data_name"),
            f"--data_dir: --data_name={info.dataset} is synthetic "
            "only (no input pipeline reads it); leave out --data_dir",
        )
    # Its outputs are no class logits: top-1/top-5 (forward-only, --eval, evaluation during
    # training, training accuracy) and the image-latency benchmark do not apply.
    for name, given in (
        ("forward_only", cfg.forward_only),
        ("eval", cfg.eval),
        ("mode", cfg.mode == "inference"),
        ("print_training_accuracy", cfg.print_training_accuracy),
        ("eval_during_training_every_n_steps", cfg.eval_during_training_every_n_steps is not None),
    ):
        if given:
            raise FlagError(
                (name, "model"),
                f"--{name}: --model={info.name} ({info.dataset}) is benchmarked "
                "in training only here; its outputs are not class logits",
            )


def resolve_workload(
    cfg: BenchConfig,
    device: torch.device | None = None,
    *,
    custom_model: bool = False,
    num_classes: int | None = None,
    image_size: int | None = None,
) -> Workload:
    """Check what needs the registry, the file system or the devices; count steps and epochs.

    ``device``: this replica's (default: :func:`replica_device`'s). ``custom_model``: the caller
    supplies the model (tests, scripts), so ``--model`` need not be registered; ``num_classes``
    and ``image_size`` then describe it.
    """
    dataset = cfg.data_name or guess_data_name(cfg.data_dir, None if custom_model else cfg.model)
    synthetic = cfg.data_dir is None
    info = None if custom_model else _model_info(cfg, dataset, synthetic)
    if info is not None:
        image_size = image_size or info.image_size
        num_classes = num_classes or info.num_classes
    device = replica_device(cfg).value if device is None else device
    # Under torchrun every process is one replica (the engine's strategy joins them).
    world = torchrun_world_size()
    train_examples, eval_examples, num_classes, layout = _data_on_disk(cfg, dataset, num_classes)
    evaluating = cfg.benchmark_mode == MODE_EVAL
    # The model's own batch size and learning rate (its registry entry's), or stoker's fallbacks
    defaults = info if info is not None and info.default_batch_size is not None else None
    per_device = cfg.batch_size or (defaults.default_batch_size if defaults else None) or FALLBACK_BATCH_SIZE
    eval_batch = (cfg.eval_batch_size or per_device) * world
    # --batch_size is per device, as in tf_cnn_benchmarks; --eval runs at the evaluation batch.
    batch = eval_batch if evaluating else per_device * world
    default_lr, model_rate, used = _model_rate(cfg, defaults, per_device * world)
    if not cfg.batch_size:
        owner = f"{cfg.model}'s" if defaults else "stoker's fallback"
        used = (f"batch size {per_device} per device ({owner} default)", *used)
    data_format = cfg.data_format
    if data_format is None:
        choice = rules.data_format(
            image_model=None if info is None else info.is_classifier, model=cfg.model, device_type=device.type
        )
        data_format = choice.value
        used = (*used, f"data format {data_format} ({choice.reason}; --data_format overrides)")
    examples = eval_examples if evaluating else train_examples
    num_batches, eval_batches = _batch_counts(cfg, synthetic, examples, eval_examples, batch, eval_batch)
    return Workload(
        dataset=dataset,
        synthetic=synthetic,
        image_size=int(image_size or 0),
        num_classes=int(num_classes or DEFAULT_NUM_CLASSES[dataset]),
        train_examples=train_examples,
        eval_examples=eval_examples,
        device=device,
        num_devices=world,
        batch_size=batch,
        num_batches=num_batches,
        num_epochs=num_batches * batch / examples,
        eval_batches=eval_batches,
        eval_batch_size=eval_batch,
        default_learning_rate=default_lr,
        model_rate=model_rate,
        defaults_used=used,
        model_info=info,
        data_layout=layout,
        data_format=data_format,
    )


def _model_info(cfg: BenchConfig, dataset: str, synthetic: bool) -> ModelInfo:
    """The registry's entry of ``--model`` on ``dataset``, refusing what it cannot do here."""
    try:
        info = get_model_info(cfg.model, dataset)
    except ValueError as e:
        raise FlagError(("model",), f"--model: {e}") from None
    _check_task(cfg, info, synthetic)
    return info


def _data_on_disk(cfg: BenchConfig, dataset: str, num_classes: int | None) -> tuple[int, int, int | None, str]:
    """``(training examples, evaluation examples, classes, layout)`` of ``--data_dir``; for synthetic
    data, the data set's sizes, the classes given and no layout."""
    train_examples = EXAMPLES_PER_EPOCH[dataset]["train"]
    eval_examples = EXAMPLES_PER_EPOCH[dataset]["validation"]
    if cfg.data_dir is None:
        return train_examples, eval_examples, num_classes, ""
    data_dir = location(cfg.data_dir)
    if not is_folder(data_dir):
        where = "no such directory" if isinstance(data_dir, Path) else "no objects under this prefix"
        raise FlagError(("data_dir",), f"--data_dir={cfg.data_dir}: {where}")
    train_examples, eval_examples, folder_classes, layout = _count_examples(dataset, data_dir)
    if folder_classes is not None and num_classes is not None and folder_classes > num_classes:
        num_classes = folder_classes  # more class folders than the model's default logits
    return train_examples, eval_examples, num_classes, layout


def _batch_counts(
    cfg: BenchConfig, synthetic: bool, examples: int, eval_examples: int, batch: int, eval_batch: int
) -> tuple[int, int | None]:
    """``(num_batches, eval_batches)``: the timed steps or batches of the mode, and the batches of an
    evaluation (``None``: one pass over real evaluation data). ``examples``: those the mode reads."""
    evaluating = cfg.benchmark_mode == MODE_EVAL
    if cfg.num_epochs is not None:
        num_batches = -(-int(cfg.num_epochs * examples) // batch)
    elif cfg.num_batches is not None:
        num_batches = cfg.num_batches
    elif evaluating and not synthetic:
        num_batches = -(-eval_examples // batch)  # one pass over the evaluation data
    else:
        num_batches = DEFAULT_NUM_BATCHES
    if cfg.mode == "inference":
        num_batches = cfg.iterations or 0
    eval_batches = cfg.num_eval_batches
    if cfg.num_eval_epochs is not None:
        eval_batches = max(1, -(-int(cfg.num_eval_epochs * eval_examples) // eval_batch))
        if evaluating:
            num_batches = eval_batches
    if eval_batches is None and synthetic and cfg.benchmark_mode != MODE_INFERENCE:
        eval_batches = num_batches  # synthetic data never ends: evaluate as many batches as training runs
    return num_batches, eval_batches


def _model_rate(
    cfg: BenchConfig, defaults: ModelInfo | None, global_batch: int
) -> tuple[float | None, LearningRate | None, tuple[str, ...]]:
    """The model's learning rate when no rate flag is given: ``(constant, schedule, description)``
    (``defaults``: the registry entry of a model with defaults of its own)."""
    rate_flags = cfg.init_learning_rate is not None or cfg.piecewise_learning_rate_schedule is not None
    resnet = defaults is not None and defaults.lr_schedule == "resnet"
    if cfg.resnet_base_lr is not None and (rate_flags or not resnet):
        why = (
            (
                "replaces the ResNet schedule's base rate; --init_learning_rate or "
                "--piecewise_learning_rate_schedule replace the whole schedule"
            )
            if rate_flags
            else (f"applies to the ResNet models of tf_cnn_benchmarks (resnet50, resnet101, ...), not {cfg.model}")
        )
        raise FlagError(("resnet_base_lr",), f"--resnet_base_lr {why}")
    if rate_flags or cfg.mode == "inference":
        return None, None, ()
    if defaults is None or defaults.default_learning_rate is None:
        return None, None, (f"learning rate {DEFAULT_LEARNING_RATE:g} (stoker's fallback)",)
    described = (describe_learning_rate(defaults),)
    if defaults.lr_schedule == "constant":
        return defaults.default_learning_rate, None, described
    return None, learning_rate_schedule(defaults, global_batch, base_lr=cfg.resnet_base_lr), described


def _count_records(data_dir: Location) -> tuple[int, int]:
    """Examples in the ``train-*-of-*`` and ``validation-*-of-*`` shards (the training ones when
    there are no validation shards); indexing them on first use (object-store shards: fetched
    into the machine's cache, where the run's sources find them and their indexes)."""
    counts: list[int] = []
    for split in ("train", "validation"):
        shards = shard_files(data_dir, split)
        try:
            counts.append(len(RecordShards(shards)) if shards else counts[0])
        except ValueError as e:
            raise FlagError(("data_dir",), f"--data_dir={data_dir}: {e}") from None
    return counts[0], counts[1]


def _count_tar_samples(data_dir: Location) -> tuple[int, int, int]:
    """Samples in the training and evaluation tar shards (:func:`~stoker.data.images.tar_shards.split_of`)
    and the classes their ``.cls`` labels need (the largest + 1); indexing them on first use."""
    counts, classes = [], 0
    for train in (True, False):
        try:
            shards = TarShards(find_tar_shards(data_dir, split_of(data_dir, train)))
        except ValueError as e:
            raise FlagError(("data_dir",), f"--data_dir={data_dir}: {e}") from None
        counts.append(len(shards))
        classes = max(classes, int(shards.labels().max(initial=-1)) + 1)
    return counts[0], counts[1], classes


def _count_cifar(data_dir: Location) -> tuple[int, int]:
    """Training and test records of the CIFAR-10 binaries of a folder or URL, from their sizes."""
    inner = data_dir / "cifar-10-batches-bin"
    sizes = {name: f.size for name, f in list_files(inner)} or {name: f.size for name, f in list_files(data_dir)}
    train = sum(size for name, size in sizes.items() if fnmatch.fnmatchcase(name, "data_batch_*.bin"))
    return train // _CIFAR_RECORD_BYTES, sizes.get("test_batch.bin", 0) // _CIFAR_RECORD_BYTES


def _count_examples(dataset: str, data_dir: Location) -> tuple[int, int, int | None, str]:
    """Examples in the training and evaluation data, the number of class folders (image
    folders only) and the layout: TFRecord shards when ``train-*-of-*`` files are there, else
    an image folder (CIFAR-10 binaries for ``cifar10``); a URL holds shards or CIFAR-10 binaries."""
    if dataset == "cifar10":
        train, test = _count_cifar(data_dir)
        if train == 0:
            raise FlagError(("data_dir",), f"--data_dir={data_dir}: no CIFAR-10 data_batch_*.bin files")
        return int(train), int(test or train), None, ""  # the data set names the layout
    if find_tar_shards(data_dir):
        return *_count_tar_samples(data_dir), TAR_SHARDS
    if shard_files(data_dir, "train"):
        if isinstance(data_dir, Path) and has_class_folders(data_dir):
            raise FlagError(
                ("data_dir",),
                f"--data_dir={data_dir} holds both train-*-of-* TFRecord shards and folders of images; "
                f"point it at one kind: {expected_layouts(data_dir)}",
            )
        return *_count_records(data_dir), None, TFRECORDS
    if not isinstance(data_dir, Path):
        raise FlagError(
            ("data_dir",),
            f"--data_dir={data_dir}: no train-*-of-* TFRecord shards or *.tar shards there; on object storage "
            "stoker reads TFRecord shards, tar shards and CIFAR-10 binaries (copy an image folder to local "
            "disk, or convert it with stoker.data.write_imagenet_tfrecords)",
        )
    train_root, eval_root = image_folder_roots(data_dir)
    try:
        classes, train_paths, _ = scan_image_folder(train_root, IMAGE_EXTENSIONS)
        eval_paths = train_paths if eval_root == train_root else scan_image_folder(eval_root, IMAGE_EXTENSIONS)[1]
    except ValueError as e:
        raise FlagError(
            ("data_dir",),
            f"--data_dir={data_dir}: no TFRecord shards, and not an image folder ({e}); {expected_layouts(data_dir)}",
        ) from None
    return len(train_paths), len(eval_paths), len(classes), IMAGE_FOLDER


def prefetch_depth(cfg: BenchConfig) -> int | None:
    """Batches the infeed prepares ahead: ``--datasets_prefetch_buffer_size`` x ``--batch_group_size``
    (0 with ``--nodatasets_use_prefetch``); ``None`` (the engine's default) when none is given."""
    if not cfg.datasets_use_prefetch:
        return 0
    if cfg.datasets_prefetch_buffer_size == 1 and cfg.batch_group_size == 1:
        return None
    return cfg.datasets_prefetch_buffer_size * cfg.batch_group_size
