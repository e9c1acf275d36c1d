"""RunConfig(compile="step"): the whole training step compiled, on CPU (inductor's C++ backend).

Compiled and eager training agree closely (different kernels, so not bitwise), a compiled run
resumes its own checkpoints bitwise, and eager and compiled runs resume each other's.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
import torch.nn.functional as F

import stoker
from helpers.tiny import TinyNet, classifier_fn, make_data, state_equal, train_input
from stoker.engine import compiled_step


def make(model_dir=None, *, compile="step", opt="sgd", dropout=0.0, model_fn=classifier_fn, **config):  # noqa: ANN001, ANN003, ANN201
    cfg = dict(model_dir=model_dir, compile=compile, progress_bar=False, iterations_per_loop=4, log_every_n_steps=10**6)
    cfg.update(config)
    optimizer = {
        "sgd": lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4),
        "adam": lambda p, ps: torch.optim.Adam(ps, lr=0.01),
    }[opt]
    return stoker.Estimator(
        model=lambda p: TinyNet(dropout=dropout),
        model_fn=model_fn,
        optimizer=optimizer,
        lr_schedule=lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),  # LR changes: no recompile
        config=stoker.RunConfig(**cfg),
        train_batch_size=16,
    )


def assert_close(a: stoker.Estimator, b: stoker.Estimator, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def test_compile_accepts_bools_and_modes_and_names_the_field():
    assert stoker.RunConfig(compile=True).compile_mode == "module"
    assert stoker.RunConfig(compile=False).compile_mode == "none"
    assert stoker.RunConfig(compile="step").compile_mode == "step"
    assert stoker.RunConfig(compile="none").compile_mode == "none"
    with pytest.raises(
        ValueError, match=r"RunConfig.compile must be True, False, 'none', 'module', 'step'; got 'graph'"
    ):
        stoker.RunConfig(compile="graph")


def test_cuda_graph_needs_a_cuda_device():
    with pytest.raises(ValueError, match=r"RunConfig.cuda_graph needs a CUDA device; RunConfig.device='cpu'"):
        stoker.RunConfig(device="cpu", cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph=True and compile='step'"):
        stoker.RunConfig(cuda_graph=True, compile="step")
    if torch.cuda.is_available():
        return
    x, y = make_data(64)
    est = make(compile=False, cuda_graph=True)  # device="auto" resolves to the CPU here
    with pytest.raises(ValueError, match="cannot be captured: a CUDA graph needs a CUDA device; this run's is 'cpu'"):
        est.train(train_input(x, y), max_steps=2)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_compiled_step_agrees_with_eager_after_20_steps(opt, caplog):
    x, y = make_data(200)
    eager = make(compile=False, opt=opt)
    eager.train(train_input(x, y), max_steps=20)
    compiled = make(opt=opt)
    with caplog.at_level(logging.INFO, logger="stoker"):
        compiled.train(train_input(x, y), max_steps=20)
    assert any("compiled the training step in" in r.getMessage() for r in caplog.records)
    assert not any("recompiled" in r.getMessage() for r in caplog.records)  # the LR schedule changed the LR twice
    # SGD within rtol 1e-5; Adam's compiled update computes its bias corrections in float32
    # tensors (eager: Python doubles), a last-bit difference its normalised update carries on.
    assert_close(eager, compiled, rtol=1e-5, atol=1e-7 if opt == "sgd" else 1e-6)
    assert compiled.state.optimizer.param_groups[0]["lr"] == eager.state.optimizer.param_groups[0]["lr"]
    assert isinstance(compiled.state.optimizer.param_groups[0]["lr"], float)


def test_compiled_resume_is_bitwise_and_modes_resume_each_other(tmp_path):
    x, y = make_data(200)
    # Compiled, with dropout (inductor's RNG is seeded from the restored global generator).
    whole = make(tmp_path / "cw", dropout=0.2)
    whole.train(train_input(x, y), max_steps=14)
    make(tmp_path / "cs", dropout=0.2).train(train_input(x, y), max_steps=7)
    resumed = make(tmp_path / "cs", dropout=0.2)
    resumed.train(train_input(x, y), max_steps=14)
    assert state_equal(whole.model, resumed.model)

    # Eager and compiled checkpoints are the same format ...
    eager_dir, compiled_dir = tmp_path / "e", tmp_path / "c"
    make(eager_dir, compile=False).train(train_input(x, y), max_steps=7)
    make(compiled_dir).train(train_input(x, y), max_steps=7)
    e_state = torch.load(eager_dir / "ckpt-7" / "train_state.pt", weights_only=False)
    c_state = torch.load(compiled_dir / "ckpt-7" / "train_state.pt", weights_only=False)
    assert e_state["optimizer"]["param_groups"] == c_state["optimizer"]["param_groups"]
    assert e_state["optimizer"]["state"].keys() == c_state["optimizer"]["state"].keys()
    e_index = json.loads((eager_dir / "checkpoint.json").read_text())
    c_index = json.loads((compiled_dir / "checkpoint.json").read_text())
    assert e_index.keys() == c_index.keys()
    from safetensors.torch import load_file

    assert (
        load_file(eager_dir / "ckpt-7" / "model.safetensors").keys()
        == load_file(compiled_dir / "ckpt-7" / "model.safetensors").keys()
    )
    # ... and each resumes the other: eager -> compiled and compiled -> eager.
    eager_whole = make(compile=False)
    eager_whole.train(train_input(x, y), max_steps=14)
    shutil.copytree(eager_dir, tmp_path / "e2c")
    e2c = make(tmp_path / "e2c")
    e2c.train(train_input(x, y), max_steps=14)
    c2e = make(compiled_dir, compile=False)
    c2e.train(train_input(x, y), max_steps=14)
    assert_close(eager_whole, e2c, atol=1e-7)
    assert_close(eager_whole, c2e, atol=1e-7)
    # The eager run resumed exactly the compiled run's step-7 state: an eager resume of an
    # eager checkpoint reproduces the whole eager run bitwise from the same kind of state.
    e2e = make(eager_dir, compile=False)
    e2e.train(train_input(x, y), max_steps=14)
    assert state_equal(eager_whole.model, e2e.model)


def test_fp16_dynamic_scaling_accumulation_clipping_and_host_call(tmp_path):
    def fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        logits = model(features)
        loss = F.cross_entropy(logits.float(), labels)
        return stoker.EstimatorSpec(loss=loss, host_call={"max_logit": logits.detach().amax()})

    x, y = make_data(200)
    kw = dict(
        model_fn=fn,
        precision="fp16",
        gradient_accumulation_steps=2,
        gradient_clip_norm=0.5,
        loss_scale=stoker.LossScale(init=2.0**20, growth_interval=3),
    )  # overflows at first: skipped steps
    eager = make(tmp_path / "e", compile=False, **kw)
    eager.train(train_input(x, y), max_steps=12)
    compiled = make(tmp_path / "c", **kw)
    compiled.train(train_input(x, y), max_steps=12)
    assert eager.state.scaler.state_dict() == compiled.state.scaler.state_dict()
    assert compiled.state.scaler.skipped_steps > 0
    assert_close(eager, compiled, rtol=1e-3, atol=1e-4)
    e_rows = [line for line in (tmp_path / "e" / "metrics.csv").read_text().splitlines() if "max_logit" in line]
    c_rows = [line for line in (tmp_path / "c" / "metrics.csv").read_text().splitlines() if "max_logit" in line]
    assert len(e_rows) == len(c_rows) > 0


def test_a_step_that_keeps_recompiling_is_an_error_naming_the_shapes(monkeypatch):
    monkeypatch.setattr(compiled_step, "RECOMPILE_LIMIT", 1)
    x, y = make_data(64)
    sizes = [16, 12, 8, 4]  # step 2 may compile again (the optimizer's new state); then 2 recompiles
    batches = [(x[i : i + s], y[i : i + s]) for i, s in enumerate(sizes)]
    est = make(compile="step")
    with pytest.raises(
        compiled_step.CompileError, match=r"recompiled 2 times.*first batch \[16, 8\] float32, this one \[4, 8\]"
    ):
        est.train(lambda p: batches, max_steps=4)


def test_graph_breaks_in_model_fn_are_reported_with_their_cause():
    def fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        loss = F.cross_entropy(model(features), labels)
        if float(loss) > 100:  # a host sync: dynamo breaks the graph here
            loss = loss * 0.5
        return stoker.EstimatorSpec(loss=loss)

    x, y = make_data(64)
    with pytest.warns(UserWarning, match=r"model_fn does not compile as one graph; graph breaks: .*"):
        make(model_fn=fn).train(train_input(x, y), max_steps=2)


def test_sharded_strategy_is_refused_by_name():
    with pytest.raises(ValueError, match="compile='step' is not supported with strategy"):
        compiled_step.check_compiled_step_supported(strategy_name="ShardedStrategy", shards_state=True)


def test_cuda_graph_refusals_name_the_cause():
    """The checks deciding when a CUDA-graph step cannot be built (pure Python, run on CPU)."""
    from types import SimpleNamespace

    from stoker.engine.cuda_graph_step import capture_refusals, cuda_graph_refusals
    from stoker.precision import FP16Precision, FP32Precision

    net = torch.nn.Linear(2, 2)
    one = SimpleNamespace(world_size=1, device=torch.device("cuda"))
    cfg = stoker.RunConfig().loop_config

    def why(opt, precision=None, params=None, config=cfg, strategy=one):  # noqa: ANN001, ANN202
        kwargs = {"optimizer": opt, "precision": precision or FP32Precision(), "params": params or {}}
        return cuda_graph_refusals(config, strategy, kwargs)

    def adam():  # noqa: ANN202
        return torch.optim.Adam(net.parameters(), capturable=True)

    assert why(adam()) == []
    assert why(torch.optim.SGD(net.parameters(), lr=0.1, fused=True)) == []
    [sgd] = why(torch.optim.SGD(net.parameters(), lr=0.1))
    assert sgd.startswith("optimizer SGD is not capturable") and "fused=True" in sgd
    dynamic = FP16Precision(loss_scale="dynamic")
    [scaling] = why(adam(), precision=dynamic)
    assert "fp16 dynamic loss scaling" in scaling and "fused=True" in scaling
    assert why(torch.optim.Adam(net.parameters(), fused=True), precision=dynamic) == []
    assert why(adam(), precision=FP16Precision(loss_scale=128)) == []
    [accumulation] = why(adam(), config=stoker.RunConfig(gradient_accumulation_steps=2).loop_config)
    assert "gradient_accumulation_steps" in accumulation
    [replicas] = why(adam(), strategy=SimpleNamespace(world_size=2, device=torch.device("cuda")))
    assert replicas.startswith("2 replicas")
    [cache] = why(adam(), params={"cache": torch.zeros(1)})
    assert "cache" in cache
    # every cause at once, each named
    reasons = capture_refusals(
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1), accumulation_steps=4, world_size=8, carries_cache=True
    )
    assert len(reasons) == 4 and "8 replicas" in reasons[1] and "SGD" in reasons[3]
    # the device and a compiled step, each with the setting to change (a compiled step's update is its own)
    assert capture_refusals(
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1), device_type="cpu", compile_mode="step"
    ) == [
        "a CUDA graph needs a CUDA device; this run's is 'cpu' (use RunConfig.device='cuda')",
        "RunConfig.compile='step' is the other way to run the step whole; drop RunConfig.compile='step' or "
        "RunConfig.cuda_graph",
    ]


def test_what_a_run_records_about_the_cuda_graph():
    from stoker.engine.cuda_graph_step import cuda_graph_choice
    from stoker.resolve import Choice

    assert cuda_graph_choice(True, "cuda", []) == Choice(True, "RunConfig.cuda_graph")
    assert cuda_graph_choice(False, "cpu", ["x"]) == Choice(False, "CUDA only")
    assert cuda_graph_choice(False, "cuda", []) == Choice(
        False, "not asked: RunConfig.cuda_graph would capture this step"
    )
    assert cuda_graph_choice(False, "cuda", ["2 replicas: ..."]).reason == (
        "not asked, and it could not capture this step: 2 replicas: ..."
    )


def test_cuda_graph_on_a_step_that_cannot_be_captured_is_an_error():
    """RunConfig(cuda_graph=True) with an unfused SGD: a ConfigError naming the cause and the fix,
    not an eager run (the device is faked: the error comes before anything runs on it)."""
    from types import SimpleNamespace

    from stoker.engine.steps import make_train_step
    from stoker.errors import ConfigError
    from stoker.precision import FP32Precision

    net = torch.nn.Linear(2, 2)
    cuda = SimpleNamespace(world_size=1, device=torch.device("cuda"))
    kwargs = {"optimizer": torch.optim.SGD(net.parameters(), lr=0.1), "precision": FP32Precision(), "params": {}}
    config = stoker.RunConfig(device="cuda", cuda_graph=True).loop_config
    with pytest.raises(ConfigError, match=r"cannot be captured: optimizer SGD is not capturable.*fused=True"):
        make_train_step(config, cuda, kwargs)
    with pytest.raises(ConfigError, match="needs a CUDA device; this run's is 'cpu' \\(use RunConfig.device='cuda'\\)"):
        make_train_step(config, SimpleNamespace(world_size=1, device=torch.device("cpu")), kwargs)


def test_a_fused_adam_is_made_capturable_and_fused_sgd_left_as_is():
    """torch refuses to capture a fused Adam's step() unless capturable=True (seen on an H200,
    torch 2.11); the CUDA-graph step sets it, which changes no value. Pure Python, run on CPU."""
    from stoker.engine.cuda_graph_step import _make_capturable

    net = torch.nn.Linear(2, 2)
    adam = torch.optim.AdamW(net.parameters(), lr=0.1, fused=True)
    adam.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    _make_capturable(adam)
    assert adam.defaults["capturable"] and all(g["capturable"] for g in adam.param_groups)
    plain = torch.optim.Adam(net.parameters(), lr=0.1)  # neither fused nor capturable: refused, not changed
    _make_capturable(plain)
    assert not plain.defaults["capturable"] and not plain.param_groups[0]["capturable"]
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, fused=True)  # no such flag: captures as is
    _make_capturable(sgd)
    assert "capturable" not in sgd.defaults and "capturable" not in sgd.param_groups[0]


def test_stoker_bench_runs_the_compiled_step():
    from stoker.bench import BenchConfig, run_benchmark

    cfg = BenchConfig(
        model="trivial",
        data_name="cifar10",
        batch_size=8,
        num_batches=3,
        num_warmup_batches=2,
        device="cpu",
        compile="step",
        display_every=10**6,
    )
    result = run_benchmark(cfg, log=lambda line: None)
    assert result["compile"] == "step" and result["images_per_sec"] > 0


def test_a_differentiable_optimizer_is_refused_by_name():
    x, y = make_data(64)
    est = stoker.Estimator(
        model=lambda p: TinyNet(dropout=0.0),
        model_fn=classifier_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1, differentiable=True),
        config=stoker.RunConfig(compile="step", progress_bar=False, log_every_n_steps=10**6),
        train_batch_size=16,
    )
    with pytest.raises(ValueError, match=r"compile='step' does not support a differentiable optimizer \(SGD"):
        est.train(train_input(x, y), max_steps=1)
