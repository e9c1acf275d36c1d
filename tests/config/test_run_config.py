"""``RunConfig``: a plain keyword-only dataclass whose groups (``pipeline``, ``loss_scale``,
``checkpoint_io``) validate themselves, whose rules across groups stay in it, which hands each
component its slice, and with which a run using the groups resumes to the same bits."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from helpers.processes import python_env
from helpers.tiny import make_data, make_estimator, optimizer_state_equal, state_equal, train_input
from stoker import CheckpointIO, LossScale, PipelineConfig, RetryPolicy, RunConfig

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


def test_run_config_is_a_plain_dataclass_without_the_flat_spellings_before_0_1():
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    assert list(inspect.signature(RunConfig).parameters) == fields
    assert RunConfig().loss_scale == LossScale() and RunConfig().checkpoint_io == CheckpointIO()
    assert RunConfig().checkpoint_io is not RunConfig().checkpoint_io  # each config its own group objects
    for old in ("pipeline_split", "loss_scale_init", "async_checkpoints", "storage_retry"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            RunConfig(**{old: None})
        assert not hasattr(RunConfig(), old)


# ------------------------------------------------------------------ resume with the groups
GROUPS = {
    "fp16": {
        "precision": "fp16",
        "loss_scale": LossScale(init=2.0**20, growth_interval=3),  # overflows, backs off, grows
        "checkpoint_io": CheckpointIO(async_save=True),
    },
    "pipeline": {
        "pipeline": PipelineConfig(split=("fc2",), microbatches=4, schedule="gpipe"),  # one process: unsplit
        "checkpoint_io": CheckpointIO(retry=FAST),
    },
}


@pytest.mark.parametrize("kind", sorted(GROUPS))
def test_a_run_with_the_groups_resumes_bitwise(tmp_path, kind):
    config = {"iterations_per_loop": 3, "save_checkpoints_steps": 5, **GROUPS[kind]}
    x, y = make_data(100)
    whole = make_estimator(tmp_path / "whole", **config)
    whole.train(train_input(x, y), max_steps=14)
    for max_steps in (7, 14):  # a new Estimator, as a new process would build, resumes from ckpt-5... ckpt-7
        resumed = make_estimator(tmp_path / "resumed", **config)
        resumed.train(train_input(x, y), max_steps=max_steps)
    assert resumed.global_step == whole.global_step == 14
    assert state_equal(resumed.model, whole.model)
    assert optimizer_state_equal(resumed.state.optimizer, whole.state.optimizer)
    if kind == "fp16":
        assert resumed.state.scaler.state_dict() == whole.state.scaler.state_dict()
        assert whole.state.scaler.skipped_steps > 0  # the dynamic scale really backed off


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
