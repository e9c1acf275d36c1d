"""``--cuda_graph``: the update each optimizer gets on CUDA is capturable (decided without a
device, so tested here on CPU), and a step that cannot be captured is an error naming why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.cli import run_main
from stoker.bench import BenchConfig, optim
from stoker.bench.optim import TFRMSProp, UpdatePlan, make_optimizer, update_plan
from stoker.bench.plan import graph_refusals
from stoker.errors import FlagError


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    return list(nn.Linear(5, 3).parameters())


@pytest.mark.parametrize(
    ("changes", "plan"),
    [
        ({"optimizer": "sgd"}, UpdatePlan(fused=True, capturable=True, decay_inside=True)),
        ({"optimizer": "momentum"}, UpdatePlan(fused=True, capturable=True, decay_inside=True)),
        # the clip must see the decayed gradient: the pre-hook adds the decay (on the device, captured too)
        ({"optimizer": "momentum", "gradient_clip": 1.0}, UpdatePlan(fused=True, capturable=True, decay_inside=False)),
        ({"optimizer": "adam"}, UpdatePlan(fused=True, capturable=True, decay_inside=False)),
        ({"optimizer": "rmsprop"}, UpdatePlan(fused=False, capturable=True, decay_inside=False)),
        ({"compile": "step"}, UpdatePlan(fused=False, capturable=False, decay_inside=False)),
    ],
)
def test_every_update_is_capturable_on_cuda(changes: dict[str, object], plan: UpdatePlan) -> None:
    cfg = BenchConfig(weight_decay=0.1, **changes)  # type: ignore[arg-type]
    assert update_plan(cfg, "cuda") == plan
    assert not update_plan(cfg, "cuda", plain=False).fused  # FSDP's DTensor parameters: torch's default update
    assert not update_plan(cfg, "cpu").capturable  # CPU: as before (fused SGD only)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "rmsprop"])
def test_optimizers_built_for_cuda_carry_the_flags(optimizer: str) -> None:
    """make_optimizer as for parameters on a CUDA device (torch builds these flags on CPU tensors
    too), and what the engine's capture check says of each."""
    from stoker.engine.cuda_graph_step import capture_refusals

    cfg = BenchConfig(optimizer=optimizer, weight_decay=0.1)
    opt = make_optimizer(cfg, _params(), 0.1, device_type="cuda")
    stand_in = optim.optimizer_for(cfg, "cuda")  # what the bench's --cuda_graph check asks the engine about
    assert type(stand_in) is type(opt) and stand_in.defaults == {**opt.defaults, "lr": 1.0}
    fused = optimizer != "rmsprop"
    assert bool(opt.defaults.get("fused")) is fused
    assert bool(opt.defaults.get("capturable")) is (optimizer in ("adam", "rmsprop"))
    assert opt.param_groups[0].get("weight_decay", 0.0) == (0.1 if optimizer in ("sgd", "momentum") else 0.0)
    assert bool(opt._optimizer_step_pre_hooks) is (optimizer in ("adam", "rmsprop"))  # the decay as a pre-hook
    assert capture_refusals(optimizer=opt) == []
    dynamic = capture_refusals(optimizer=opt, dynamic_scaling=True)
    assert dynamic == [] if fused else "fp16 dynamic loss scaling" in dynamic[0]


def _engine_refusals(cfg: BenchConfig, device_type: str, replicas: int) -> list[str]:
    """What the engine refuses for the run the bench builds from ``cfg`` with ``--cuda_graph=true``:
    the bench's RunConfig (its checks: device, compile='step', bf16-sr), then the engine's capture
    check of the step (``make_train_step``'s) over the optimizer the bench builds for the device."""
    from types import SimpleNamespace

    from stoker.bench.plan import model_params, run_config
    from stoker.engine.cuda_graph_step import cuda_graph_refusals as engine_refusals
    from stoker.errors import ConfigError

    try:
        config = run_config(cfg.replace(cuda_graph=True), device_type)
    except ConfigError as e:
        return [str(e)]
    kwargs = {
        "optimizer": make_optimizer(cfg, _params(), 0.1, device_type=device_type),
        "precision": config.make_precision(),
        "params": model_params(cfg),
    }
    return engine_refusals(
        config.loop_config, SimpleNamespace(world_size=replicas, device=torch.device(device_type)), kwargs
    )


def test_bench_says_capturable_exactly_when_the_engine_does() -> None:
    """The bench's flag check (``stoker bench --cuda_graph``, before anything is built) and the
    engine's (``RunConfig(cuda_graph=True)`` over the built step) agree on every combination of the
    knobs either reads: the optimizer, clipping, weight decay, precision and loss scaling, fp16
    weights, compile, replicas and the device. The optimizers are built over CPU tensors with the
    flags they get on that device (torch builds fused and capturable optimizers on CPU)."""
    import itertools

    knobs = itertools.product(
        ("sgd", "momentum", "adam", "rmsprop"),
        (None, 1.0),  # --gradient_clip
        (0.0, 1e-4),  # --weight_decay
        ("fp32", "fp16", "fp16 dynamic", "fp16 weights", "bf16"),
        (False, "module", "step"),
        (("cuda", 1), ("cuda", 2), ("cpu", 1)),
    )
    capturable = {}
    for optimizer, clip, decay, precision, compile_, (device_type, replicas) in knobs:
        cfg = BenchConfig(
            optimizer=optimizer,
            gradient_clip=clip,
            weight_decay=decay,
            precision=precision.split()[0],
            fp16_enable_auto_loss_scale=precision == "fp16 dynamic",
            fp16_vars=precision == "fp16 weights",
            compile=compile_,
        )
        bench = graph_refusals(cfg, device_type, replicas=replicas)
        engine = _engine_refusals(cfg, device_type, replicas)
        key = (optimizer, clip, decay, precision, compile_, device_type, replicas)
        assert (not bench) == (not engine), (key, bench, engine)
        capturable[key] = not bench
    # Both answers were reached, and by the update's own rule too (fp16 dynamic scaling needs a fused optimizer).
    assert capturable[("rmsprop", 1.0, 1e-4, "fp16", "module", "cuda", 1)]
    assert capturable[("momentum", None, 1e-4, "fp16 dynamic", False, "cuda", 1)]
    assert not capturable[("rmsprop", None, 1e-4, "fp16 dynamic", False, "cuda", 1)]
    assert (
        sum(capturable.values()) == 4 * 2 * 2 * 5 * 2 - 2 * 2 * 2
    )  # cuda, one replica, not step: all but rmsprop's dynamic


def test_tf_rmsprop_takes_a_device_tensor_rate() -> None:
    """The CUDA-graph step hands the optimizer its rate as a tensor: the update is the float one's
    (to fp32 rounding: the product is formed in another order) and reads nothing back."""

    def run(lr: float | torch.Tensor) -> list[torch.Tensor]:
        params = _params()
        opt = TFRMSProp(params, lr=0.1, decay=0.9, momentum=0.9, eps=1.0, capturable=True)
        for i in range(4):
            opt.param_groups[0]["lr"] = lr
            for p in params:
                p.grad = torch.full_like(p, 0.5 * (i + 1)) - p.detach()
            opt.step()
        return [p.detach().clone() for p in params]

    for a, b, start in zip(run(0.05), run(torch.tensor(0.05)), _params(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(a, start)  # the update moved the weights


def test_cuda_graph_refusals_name_the_flag_and_the_fix() -> None:
    """The engine's capture rule, asked by the bench before anything is built, in the flags' words."""
    from stoker.bench.flags import FlagNames
    from stoker.resolve import spelled

    def refusals(cfg: BenchConfig, device_type: str, replicas: int = 1) -> list[str]:
        return [spelled(r, FlagNames()) for r in graph_refusals(cfg, device_type, replicas=replicas)]

    for optimizer in ("sgd", "momentum", "adam", "rmsprop"):
        assert refusals(BenchConfig(optimizer=optimizer, cuda_graph=True), "cuda") == []
    assert refusals(BenchConfig(), "cpu") == [
        "a CUDA graph needs a CUDA device; this run's is 'cpu' (use --device=cuda)"
    ]
    [replicas] = refusals(BenchConfig(), "cuda", replicas=2)
    assert replicas.startswith("2 replicas") and "use one replica" in replicas
    fp16 = BenchConfig(optimizer="rmsprop", precision="fp16", fp16_enable_auto_loss_scale=True)
    [scaling] = refusals(fp16, "cuda")
    assert "fp16 dynamic loss scaling" in scaling and "TFRMSProp" in scaling and "static --fp16_loss_scale" in scaling
    assert refusals(fp16.replace(optimizer="momentum"), "cuda") == []
    assert refusals(BenchConfig(compile="step"), "cuda") == [
        "--compile=step is the other way to run the step whole; drop --compile=step or --cuda_graph"
    ]


def test_cuda_graph_where_it_cannot_capture_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Asked for explicitly, a graph that cannot be captured is a flag error (exit 2) naming why,
    not an eager run: here the device (auto) is this CPU machine."""
    if torch.cuda.is_available():
        pytest.skip("the auto device is a GPU here")
    code, out, err = run_main(
        capsys, "bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--num_batches=1", "--cuda_graph"
    )
    assert code == 2, out
    assert "--cuda_graph=true, but this training step cannot be captured" in err
    assert "needs a CUDA device; this run's is 'cpu'" in err and "drop --cuda_graph" in err
    assert "images/sec" not in out  # nothing ran


def test_run_benchmark_raises_the_flag_error() -> None:
    from stoker.bench import run_benchmark

    if torch.cuda.is_available():
        pytest.skip("the auto device is a GPU here")
    cfg = BenchConfig(model="trivial", data_name="cifar10", batch_size=8, num_batches=1, cuda_graph=True)
    with pytest.raises(FlagError, match="cannot be captured") as e:
        run_benchmark(cfg, log=lambda line: None)
    assert e.value.flags == ("cuda_graph", "device")  # the flags the message names


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "rmsprop"])
def test_bench_cuda_graph_captures_every_optimizer(optimizer: str, caplog: pytest.LogCaptureFixture) -> None:
    """On CUDA ``--cuda_graph=true`` captures the step with each optimizer the bench offers (no
    eager fall-back) and trains the eager run's losses (to fp32 rounding: the graph hands the
    optimizer a device-tensor rate)."""
    import logging

    from stoker.bench import run_benchmark

    def losses(graph: bool) -> list[float]:
        cfg = BenchConfig(
            model="trivial",
            data_name="cifar10",
            batch_size=16,
            num_batches=8,
            num_warmup_batches=2,
            iterations_per_loop=2,
            device="cuda",
            optimizer=optimizer,
            cuda_graph=graph,
            init_learning_rate=0.01,
            weight_decay=1e-4,
            display_every=1000,
        )
        return run_benchmark(cfg, log=lambda line: None)["losses"]

    eager = losses(False)
    with caplog.at_level(logging.INFO, logger="stoker"):
        graphed = losses(True)
    messages = [r.getMessage() for r in caplog.records]
    assert any("captured the training step" in m for m in messages), messages
    assert not any("eagerly" in m for m in messages), messages
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-5)
