"""``RunConfig``'s groups: ``pipeline``, ``loss_scale`` and ``checkpoint_io`` validate themselves, the flat
spellings before 0.2 still work (with a ``DeprecationWarning`` naming the new one), and a run spelled
either way trains and resumes to the same bits."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import warnings

import pytest
import torch

from helpers.paths import ROOT
from helpers.processes import python_env
from helpers.tiny import make_data, make_estimator, state_equal, train_input
from stoker import CheckpointIO, LossScale, PipelineConfig, RetryPolicy, RunConfig
from stoker.config import DEPRECATED

FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.01, timeout=30.0)


# ------------------------------------------------------------------ each group validates itself
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LossScale(dynamic="yes"), r"LossScale.dynamic must be True or False; got 'yes'"),
        (lambda: LossScale(init=0), r"LossScale.init must be a positive finite number; got 0"),
        (lambda: LossScale(init=float("inf")), r"LossScale.init must be a positive finite number; got inf"),
        (lambda: LossScale(init="big"), r"LossScale.init must be a positive finite number; got 'big'"),
        (lambda: LossScale(growth_interval=0), r"LossScale.growth_interval must be a positive integer; got 0"),
        (lambda: LossScale(growth_interval=2.5), r"LossScale.growth_interval must be a positive integer; got 2.5"),
        (lambda: PipelineConfig(split=()), r"PipelineConfig.split must be the module names to split before"),
        (lambda: PipelineConfig(split=("a", "")), r"PipelineConfig.split must be the module names"),
        (lambda: PipelineConfig(split=("a", "a")), r"PipelineConfig.split names a module twice: \['a', 'a'\]"),
        (lambda: PipelineConfig(split="a", microbatches=0), r"PipelineConfig.microbatches must be a positive integer"),
        (
            lambda: PipelineConfig(split="a", stages_per_process=0),
            r"PipelineConfig.stages_per_process must be a positive integer; got 0",
        ),
        (
            lambda: PipelineConfig(split="a", schedule="zb"),
            r"PipelineConfig.schedule must be one of gpipe, 1f1b, interleaved1f1b; got 'zb'",
        ),
        (
            lambda: PipelineConfig(split="a", schedule="interleaved1f1b"),
            r"schedule='interleaved1f1b' needs stages_per_process >= 2, and 'gpipe' / '1f1b' need 1",
        ),
        (
            lambda: PipelineConfig(split="a", schedule="gpipe", stages_per_process=2),
            r"schedule='interleaved1f1b' needs stages_per_process >= 2, and 'gpipe' / '1f1b' need 1",
        ),
        (
            lambda: PipelineConfig(split=("a", "b"), schedule="interleaved1f1b", stages_per_process=2),
            r"PipelineConfig: 3 pipeline stages \(split names 2 modules\) cannot be spread evenly at "
            r"stages_per_process=2",
        ),
        (lambda: CheckpointIO(async_save="yes"), r"CheckpointIO.async_save must be True or False; got 'yes'"),
        (lambda: CheckpointIO(retry={"attempts": 2}), r"CheckpointIO.retry must be a stoker.storage.RetryPolicy"),
        (lambda: RetryPolicy(attempts=0), r"RetryPolicy.attempts must be a positive integer; got 0"),
        (lambda: RetryPolicy(backoff=-1), r"RetryPolicy.backoff must be a number >= 0 \(seconds\); got -1"),
        (lambda: RetryPolicy(timeout="10"), r"RetryPolicy.timeout must be a number >= 0 \(seconds\); got '10'"),
    ],
)
def test_each_group_names_the_field_and_the_values_it_accepts(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_groups_normalise_what_they_are_given():
    assert PipelineConfig(split="layers.2").split == ("layers.2",)
    assert PipelineConfig(split=["a", "b"]).split == ("a", "b") and PipelineConfig(split=["a", "b"]).stages == 3
    assert PipelineConfig(split=("a", "b", "c"), schedule="interleaved1f1b", stages_per_process=2).stages == 4
    assert LossScale(init=128).init == 128.0 and isinstance(LossScale(init=128).init, float)
    assert RetryPolicy(timeout=0).timeout == 0  # 0: no time limit


def test_loss_scale_short_forms_become_a_loss_scale():
    assert RunConfig().loss_scale == LossScale() == RunConfig(loss_scale="dynamic").loss_scale
    assert RunConfig(loss_scale=128).loss_scale == LossScale(dynamic=False, init=128.0)
    assert RunConfig(loss_scale=0.5).loss_scale == LossScale(dynamic=False, init=0.5)
    for bad in ("auto", -1, 0, True, None):
        with pytest.raises(ValueError, match="loss_scale must be a positive number or 'dynamic'"):
            RunConfig(loss_scale=bad)


def test_run_config_takes_only_group_objects_for_its_groups():
    with pytest.raises(ValueError, match=r"RunConfig.pipeline must be None or a stoker.distributed.PipelineConfig"):
        RunConfig(pipeline=("layers.2",))
    with pytest.raises(ValueError, match=r"RunConfig.checkpoint_io must be a stoker.checkpoint.CheckpointIO"):
        RunConfig(checkpoint_io=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "pipeline"}, r"strategy='pipeline' needs pipeline=PipelineConfig\(split=...\)"),
        (
            {"pipeline": PipelineConfig(split="a"), "strategy": "replicated"},
            r"RunConfig.pipeline needs strategy 'auto' or 'pipeline'; got 'replicated'",
        ),
        (
            {"pipeline": PipelineConfig(split="a"), "gradient_accumulation_steps": 2},
            r"micro-batches are PipelineConfig.microbatches; set gradient_accumulation_steps=1 \(got 2\)",
        ),
        (
            {"pipeline": PipelineConfig(split="a"), "precision": "fp16"},
            r"a pipeline runs the eager step in fp32 or bf16.*precision='fp16'",
        ),
        (
            {"pipeline": PipelineConfig(split="a"), "compile": "step"},
            r"a pipeline runs the eager step in fp32 or bf16.*compile='step'",
        ),
        (
            {"precision": "bf16-sr", "loss_scale": LossScale(dynamic=False, init=64)},
            r"RunConfig.loss_scale=64 is fp16 loss scaling; precision='bf16-sr'",
        ),
    ],
)
def test_cross_field_rules_stay_in_run_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**kwargs)


def test_run_config_stays_a_dataclass():
    config = RunConfig(
        pipeline=PipelineConfig(split="a", microbatches=2),
        loss_scale=LossScale(init=2.0**10),
        checkpoint_io=CheckpointIO(async_save=True, retry=FAST),
    )
    assert [f.name for f in dataclasses.fields(config)][-2:] == ["pipeline", "checkpoint_io"]
    assert "pipeline=PipelineConfig(split=('a',), microbatches=2" in repr(config)
    assert "checkpoint_io=CheckpointIO(async_save=True, retry=RetryPolicy(attempts=3" in repr(config)
    assert dataclasses.replace(config, seed=3) == config.replace(seed=3) != config
    assert dataclasses.replace(config, seed=3).pipeline is config.pipeline
    assert config.replace(pipeline=None).pipeline_stages == 1 and config.pipeline_stages == 2
    assert config.to_dict()["checkpoint_io"] == {
        "async_save": True,
        "retry": {"attempts": 3, "backoff": 0.001, "max_backoff": 0.01, "timeout": 30.0},
    }
    with pytest.raises(ValueError, match="PipelineConfig.microbatches must be a positive integer"):
        dataclasses.replace(config.pipeline, microbatches=0)  # frozen groups are replaced, and checked again
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.pipeline.microbatches = 4  # type: ignore[misc]


def test_stoker_itself_emits_no_deprecation_warning():
    code = (
        "import stoker, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "c = stoker.RunConfig()\n"
        "c = c.replace(seed=1)\n"
        "from stoker.recipes.bert import BertConfig\n"
        "BertConfig(num_layers=4, hidden_layers_per_stage=2).run_config()\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ the spellings before 0.2
OLD_AND_NEW = [
    ({"pipeline_split": ("a",)}, {"pipeline": PipelineConfig(split=("a",))}),
    ({"pipeline_split": "a", "pipeline_microbatches": 4}, {"pipeline": PipelineConfig(split="a", microbatches=4)}),
    (
        {"pipeline_split": ("a",), "pipeline_schedule": "gpipe"},
        {"pipeline": PipelineConfig(split="a", schedule="gpipe")},
    ),
    (
        {"pipeline_split": ("a", "b", "c"), "pipeline_schedule": "interleaved1f1b", "pipeline_stages_per_process": 2},
        {"pipeline": PipelineConfig(split=("a", "b", "c"), schedule="interleaved1f1b", stages_per_process=2)},
    ),
    ({"pipeline_microbatches": 4}, {}),  # no split, no pipeline: checked, no effect (as before 0.2)
    ({"loss_scale_init": 2.0**20}, {"loss_scale": LossScale(init=2.0**20)}),
    ({"loss_scale_growth_interval": 3}, {"loss_scale": LossScale(growth_interval=3)}),
    (
        {"loss_scale": "dynamic", "loss_scale_init": 64, "loss_scale_growth_interval": 3},
        {"loss_scale": LossScale(init=64.0, growth_interval=3)},
    ),
    (  # a static scale had no initial scale: loss_scale_init did nothing then, and does nothing now
        {"loss_scale": 128, "loss_scale_init": 64},
        {"loss_scale": LossScale(dynamic=False, init=128.0)},
    ),
    ({"async_checkpoints": True}, {"checkpoint_io": CheckpointIO(async_save=True)}),
    ({"storage_retry": FAST}, {"checkpoint_io": CheckpointIO(retry=FAST)}),
    (
        {"async_checkpoints": True, "storage_retry": FAST},
        {"checkpoint_io": CheckpointIO(async_save=True, retry=FAST)},
    ),
]
NEW_SPELLING = {
    "pipeline_split": r"use RunConfig\(pipeline=PipelineConfig\(split=...\)\)",
    "pipeline_microbatches": r"use RunConfig\(pipeline=PipelineConfig\(microbatches=...\)\)",
    "pipeline_schedule": r"use RunConfig\(pipeline=PipelineConfig\(schedule=...\)\)",
    "pipeline_stages_per_process": r"use RunConfig\(pipeline=PipelineConfig\(stages_per_process=...\)\)",
    "loss_scale_init": r"use RunConfig\(loss_scale=LossScale\(init=...\)\)",
    "loss_scale_growth_interval": r"use RunConfig\(loss_scale=LossScale\(growth_interval=...\)\)",
    "async_checkpoints": r"use RunConfig\(checkpoint_io=CheckpointIO\(async_save=...\)\)",
    "storage_retry": r"use RunConfig\(checkpoint_io=CheckpointIO\(retry=...\)\)",
}


def test_the_table_covers_every_deprecated_name():
    assert set(NEW_SPELLING) == set(DEPRECATED)
    assert set(DEPRECATED) == {name for old, _ in OLD_AND_NEW for name in old if name != "loss_scale"}


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW, ids=lambda kw: ",".join(kw) or "nothing")
def test_an_old_spelling_builds_the_same_config_and_names_the_new_one(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = RunConfig(**old)
    deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    names = [n for n in old if n in DEPRECATED]
    assert len(deprecated) == len(names), deprecated
    for name, message in zip(names, deprecated, strict=True):
        assert message.startswith(f"RunConfig({name}=...) is deprecated; ")
        assert re.search(NEW_SPELLING[name], message), message
        assert "goes away after 0.2" in message
    assert built == RunConfig(**new)


@pytest.mark.parametrize("name", sorted(NEW_SPELLING))
def test_each_old_keyword_warns_with_pytest_warns(name):
    value = {
        "pipeline_split": ("a",),
        "pipeline_microbatches": 2,
        "pipeline_schedule": "gpipe",
        "pipeline_stages_per_process": 1,
        "loss_scale_init": 8.0,
        "loss_scale_growth_interval": 5,
        "async_checkpoints": True,
        "storage_retry": FAST,
    }[name]
    with pytest.warns(DeprecationWarning, match=rf"RunConfig\({name}=...\) is deprecated; {NEW_SPELLING[name]}"):
        RunConfig(**{name: value})


def test_old_attributes_read_the_groups_with_a_warning():
    config = RunConfig(
        pipeline=PipelineConfig(
            split=("a", "b", "c"), microbatches=4, schedule="interleaved1f1b", stages_per_process=2
        ),
        loss_scale=LossScale(init=64.0, growth_interval=7),
        checkpoint_io=CheckpointIO(async_save=True, retry=FAST),
    )
    expected = {
        "pipeline_split": ("a", "b", "c"),
        "pipeline_microbatches": 4,
        "pipeline_schedule": "interleaved1f1b",
        "pipeline_stages_per_process": 2,
        "loss_scale_init": 64.0,
        "loss_scale_growth_interval": 7,
        "async_checkpoints": True,
        "storage_retry": FAST,
    }
    for name, value in expected.items():
        group, attr = DEPRECATED[name]
        with pytest.warns(DeprecationWarning, match=rf"RunConfig.{name} is deprecated; read RunConfig.{group}.{attr}"):
            assert getattr(config, name) == value
    plain = RunConfig()  # without a pipeline: what the flat fields held then
    with pytest.warns(DeprecationWarning):
        assert (plain.pipeline_split, plain.pipeline_microbatches, plain.pipeline_schedule) == (None, 1, "1f1b")
    with pytest.warns(DeprecationWarning):
        assert (plain.async_checkpoints, plain.storage_retry, plain.loss_scale_init) == (False, RetryPolicy(), 2.0**15)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"pipeline": PipelineConfig(split="a"), "pipeline_microbatches": 4},
            r"RunConfig: pipeline_microbatches= and pipeline= both given.*pass only "
            r"pipeline=PipelineConfig\(microbatches=4\)",
        ),
        (
            {"pipeline": PipelineConfig(split="a"), "pipeline_split": ("a",)},
            r"pipeline_split= and pipeline= both given",
        ),
        (
            {"loss_scale": LossScale(), "loss_scale_init": 8.0},
            r"loss_scale_init= and loss_scale= both given.*pass only loss_scale=LossScale\(init=8.0\)",
        ),
        (
            {"loss_scale": LossScale(dynamic=False, init=4), "loss_scale_growth_interval": 3},
            r"loss_scale_growth_interval= and loss_scale= both given",
        ),
        (
            {"checkpoint_io": CheckpointIO(), "async_checkpoints": True},
            r"async_checkpoints= and checkpoint_io= both given.*"
            r"pass only checkpoint_io=CheckpointIO\(async_save=True\)",
        ),
        (
            {"checkpoint_io": CheckpointIO(async_save=True), "storage_retry": FAST},
            r"storage_retry= and checkpoint_io= both given",
        ),
    ],
)
def test_old_and_new_spelling_of_one_setting_is_an_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**kwargs)
    base = RunConfig()
    with pytest.raises(ValueError, match=message.split(".*")[0]):
        base.replace(**kwargs)


def test_replace_with_an_old_name_changes_that_setting_of_the_group():
    config = RunConfig(
        pipeline=PipelineConfig(split="a", microbatches=2),
        loss_scale=LossScale(init=64.0, growth_interval=7),
        checkpoint_io=CheckpointIO(retry=FAST),
    )
    with pytest.warns(DeprecationWarning, match=NEW_SPELLING["pipeline_microbatches"]):
        assert config.replace(pipeline_microbatches=4).pipeline == PipelineConfig(split="a", microbatches=4)
    with pytest.warns(DeprecationWarning, match=NEW_SPELLING["loss_scale_growth_interval"]):
        assert config.replace(loss_scale_growth_interval=3).loss_scale == LossScale(init=64.0, growth_interval=3)
    with pytest.warns(DeprecationWarning, match=NEW_SPELLING["async_checkpoints"]):
        assert config.replace(async_checkpoints=True).checkpoint_io == CheckpointIO(async_save=True, retry=FAST)
    with pytest.warns(DeprecationWarning, match=NEW_SPELLING["pipeline_split"]):
        assert config.replace(pipeline_split=None).pipeline is None
    with pytest.warns(DeprecationWarning):  # dataclasses.replace of a config that holds the defaults works too
        assert dataclasses.replace(RunConfig(), async_checkpoints=True) == RunConfig(
            checkpoint_io=CheckpointIO(async_save=True)
        )


def test_a_bad_value_in_an_old_spelling_names_the_group_field():
    cases = [
        ({"pipeline_split": ("a",), "pipeline_schedule": "zb"}, "PipelineConfig.schedule must be one of gpipe, 1f1b"),
        ({"pipeline_schedule": "zb"}, "PipelineConfig.schedule must be one of"),  # no split: checked as before 0.2
        ({"loss_scale_init": 0}, "LossScale.init must be a positive finite number"),
        ({"async_checkpoints": 1}, "CheckpointIO.async_save must be True or False"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            RunConfig(**kwargs)


# ------------------------------------------------------------------ resume is the same, spelled either way
SPELLINGS = {
    "fp16": (
        {"precision": "fp16", "loss_scale_init": 2.0**20, "loss_scale_growth_interval": 3, "async_checkpoints": True},
        {
            "precision": "fp16",
            "loss_scale": LossScale(init=2.0**20, growth_interval=3),  # overflows, backs off, grows
            "checkpoint_io": CheckpointIO(async_save=True),
        },
    ),
    "pipeline": (
        {"pipeline_split": ("fc2",), "pipeline_microbatches": 4, "pipeline_schedule": "gpipe", "storage_retry": FAST},
        {
            "pipeline": PipelineConfig(split=("fc2",), microbatches=4, schedule="gpipe"),  # one process: unsplit
            "checkpoint_io": CheckpointIO(retry=FAST),
        },
    ),
}


def _train_and_resume(model_dir, x, y, warn: bool, **config):  # noqa: ANN001, ANN202
    common = {"iterations_per_loop": 3, "save_checkpoints_steps": 5}
    runs = []
    for max_steps in (7, 14):  # a new Estimator, as a new process would build, resumes from ckpt-5... ckpt-7
        if warn:
            with pytest.warns(DeprecationWarning):
                est = make_estimator(model_dir, **common, **config)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                est = make_estimator(model_dir, **common, **config)
        est.train(train_input(x, y), max_steps=max_steps)
        runs.append(est)
    return runs[-1]


@pytest.mark.parametrize("kind", sorted(SPELLINGS))
def test_resume_is_bitwise_the_same_with_the_old_and_the_new_spelling(tmp_path, kind):
    old, new = SPELLINGS[kind]
    x, y = make_data(100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        whole = make_estimator(tmp_path / "whole", iterations_per_loop=3, save_checkpoints_steps=5, **new)
        whole.train(train_input(x, y), max_steps=14)
    by_old = _train_and_resume(tmp_path / "old", x, y, warn=True, **old)
    by_new = _train_and_resume(tmp_path / "new", x, y, warn=False, **new)
    assert by_old.config.replace(model_dir=None) == by_new.config.replace(model_dir=None)
    assert by_old.global_step == by_new.global_step == whole.global_step == 14
    assert state_equal(by_old.model, by_new.model) and state_equal(by_new.model, whole.model)
    for key, value in by_new.state.optimizer.state_dict()["state"].items():
        for name, t in value.items():
            assert torch.equal(
                torch.as_tensor(t), torch.as_tensor(by_old.state.optimizer.state_dict()["state"][key][name])
            )
    if kind == "fp16":
        assert by_old.state.scaler.state_dict() == by_new.state.scaler.state_dict() == whole.state.scaler.state_dict()
        assert by_new.state.scaler.skipped_steps > 0  # the dynamic scale really backed off


# ------------------------------------------------------------------ the slices each component is handed
def test_each_slice_rejects_a_bad_value_with_a_config_error_naming_the_field():
    from stoker import ConfigError
    from stoker.checkpoint import CheckpointConfig
    from stoker.config import EvalConfig, InputConfig, LoopConfig, StateConfig
    from stoker.distributed import DistributionConfig

    cases = [
        (
            lambda: LoopConfig(iterations_per_loop=0),
            r"^RunConfig.iterations_per_loop must be a positive integer; got 0$",
        ),
        (lambda: LoopConfig(compile="graph"), r"^RunConfig.compile must be True, False, 'none', 'module', 'step'"),
        (lambda: LoopConfig(cuda_graph=True, compile="step"), r"cuda_graph=True and compile='step' are two ways"),
        (lambda: InputConfig(prefetch_depth=-1), r"^RunConfig.prefetch_depth must be >= 0; got -1$"),
        (lambda: StateConfig(fast_linear="fast"), r"^RunConfig.fast_linear must be one of .*; got 'fast'$"),
        (lambda: StateConfig(recompute=[""]), r"^RunConfig.recompute must be None, 'all', or module-name patterns"),
        (lambda: CheckpointConfig(keep_checkpoint_max=-1), r"^RunConfig.keep_checkpoint_max must be >= 0"),
        (lambda: CheckpointConfig(keep_best=("loss", "low")), r"^RunConfig.keep_best must be \(metric_name"),
        (lambda: CheckpointConfig(io=True), r"^RunConfig.checkpoint_io must be a stoker.checkpoint.CheckpointIO"),
        (lambda: DistributionConfig(strategy="ring"), r"^RunConfig.strategy must be one of auto, single, .*'ring'$"),
        (lambda: DistributionConfig(device="tpu"), r"^RunConfig.device must be auto, cpu, cuda or cuda:N; got 'tpu'$"),
    ]
    for build, message in cases:
        with pytest.raises(ConfigError, match=message):
            build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        LoopConfig().iterations_per_loop = 3  # type: ignore[misc]
    assert EvalConfig() == EvalConfig(seed=0, summaries=True, keep_best=None)


def test_run_config_hands_each_component_its_slice():
    from stoker.config import LoopConfig

    config = RunConfig(
        model_dir="/tmp/m",
        seed=7,
        iterations_per_loop=4,
        gradient_accumulation_steps=2,
        compile=True,
        save_checkpoints_steps=3,
        keep_best=["loss", "min"],
        prefetch_depth=0,
        recompute="layers.*",
        checkpoint_io=CheckpointIO(async_save=True),
        device="cpu",
        pipeline=None,
    )
    assert config.loop_config == LoopConfig(iterations_per_loop=4, gradient_accumulation_steps=2, compile="module")
    assert (config.input_config.seed, config.input_config.snapshot_every, config.input_config.prefetch_depth) == (
        7,
        8,
        0,
    )
    state = config.state_config
    assert (state.seed, state.compile, state.recompute, state.async_save) == (7, "module", ("layers.*",), True)
    saving = config.checkpoint_config
    assert (saving.model_dir, saving.save_checkpoints_steps, saving.save_checkpoints_secs) == ("/tmp/m", 3, None)
    assert saving.keep_best == config.eval_config.keep_best == config.keep_best == ("loss", "min")
    assert config.distribution_config.device == "cpu" and config.distribution_config.pipeline_stages == 1
    assert RunConfig().checkpoint_config.save_checkpoints_secs == RunConfig().save_checkpoints_secs == 600.0
    # a RunConfig error is the slice's error: the same message either way
    with pytest.raises(ValueError, match=r"^RunConfig.iterations_per_loop must be a positive integer; got 0$"):
        RunConfig(iterations_per_loop=0)


def test_the_old_spellings_live_in_one_module_with_their_removal_version():
    import ast

    from stoker.config import REMOVED_IN, deprecated

    assert REMOVED_IN == "0.3" and deprecated.DEPRECATED is DEPRECATED
    src = ROOT / "src" / "stoker"
    files = [*sorted((src / "config").glob("*.py")), *sorted((src / "engine").glob("*.py")), src / "estimator.py"]
    users = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "attr", None) or getattr(node, "arg", None) or getattr(node, "id", None)
            if name in DEPRECATED:
                users.add(path.relative_to(src).as_posix())
    assert not users, f"the pre-0.2 names are used outside config/deprecated.py's table: {sorted(users)}"
