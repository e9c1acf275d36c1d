"""The Estimator's contract: exact values on tiny models, loop boundaries, batch rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import stoker
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.hooks import Hook


def linear_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    pred = model(features).squeeze(-1)
    per_example = (pred - labels) ** 2
    return stoker.EstimatorSpec(
        loss=per_example.mean() if mode == stoker.ModeKeys.TRAIN else per_example,
        predictions={"y": pred},
        eval_metrics={"mse": stoker.metrics.MeanSquaredError()(pred, labels)},
        host_call={"w0": model.weight[0, 0].detach()},
    )


def linear_estimator(model_dir=None, **config):  # noqa: ANN001, ANN201
    def build(params):  # noqa: ANN001, ANN202
        m = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.tensor([[1.0, -1.0]]))
        return m

    cfg = {"model_dir": model_dir, "progress_bar": False, "iterations_per_loop": 2}
    cfg.update(config)
    return stoker.Estimator(
        model=build,
        model_fn=linear_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(**cfg),
        train_batch_size=2,
    )


X = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
Y = torch.tensor([1.0, 2.0])


def whole_batch(params):  # noqa: ANN001, ANN201
    return stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(shuffle=False).for_replica(params))


def test_exact_sgd_values_on_a_linear_model():
    est = linear_estimator()
    est.train(whole_batch, max_steps=3)
    # By hand: w <- w - lr * mean(2 (x.w - y) x), starting from w = (1, -1).
    w = np.array([1.0, -1.0])
    x, y = X.numpy().astype(np.float64), Y.numpy().astype(np.float64)
    for _ in range(3):
        w = w - 0.1 * (2 * (x @ w - y)[:, None] * x).mean(0)
    # step 1: residuals (-2, -3) -> grad (-11, -16) -> w = (2.1, 0.6)
    np.testing.assert_allclose(est.model.weight.detach().numpy()[0], w, rtol=1e-6)
    assert est.global_step == 3


def test_evaluate_returns_loss_metrics_and_step():
    est = linear_estimator()
    est.train(whole_batch, max_steps=1)  # w = (2.1, 0.6)
    res = est.evaluate(
        lambda p: stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p))
    )
    # predictions: 1*2.1+2*0.6 = 3.3 and 3*2.1+4*0.6 = 8.7 -> squared errors 5.29 and 44.89
    assert res["global_step"] == 1
    assert res["loss"] == pytest.approx((5.29 + 44.89) / 2, rel=1e-6)
    assert res["mse"] == pytest.approx((5.29 + 44.89) / 2, rel=1e-6)


class Recorder(Hook):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def begin(self, run):  # noqa: ANN001
        self.calls.append(("begin", run.global_step))

    def after_setup(self, run):  # noqa: ANN001
        self.calls.append(("after_setup", run.global_step))

    def before_loop(self, run, steps):  # noqa: ANN001
        self.calls.append(("before_loop", run.global_step, steps))

    def after_loop(self, run, result):  # noqa: ANN001
        self.calls.append(("after_loop", run.global_step, result.steps, len(result.losses)))
        self.last = result

    def end(self, run):  # noqa: ANN001
        self.calls.append(("end", run.global_step))


def test_loops_are_shortened_to_hit_max_steps_exactly():
    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=10)
    rec = Recorder()
    est.train(train_input(x, y), max_steps=23, hooks=[rec])
    assert rec.calls == [
        ("begin", 0),
        ("after_setup", 0),
        ("before_loop", 0, 10),
        ("after_loop", 10, 10, 10),
        ("before_loop", 10, 10),
        ("after_loop", 20, 10, 10),
        ("before_loop", 20, 3),
        ("after_loop", 23, 3, 3),
        ("end", 23),
    ]
    rec2 = Recorder()
    est.train(train_input(x, y), steps=5, hooks=[rec2])
    assert [c for c in rec2.calls if c[0] == "before_loop"] == [("before_loop", 23, 5)]
    assert est.global_step == 28


def test_host_call_values_are_read_per_step():
    est = linear_estimator(iterations_per_loop=3)
    rec = Recorder()
    est.train(whole_batch, max_steps=3, hooks=[rec])
    w0 = rec.last.values["w0"]
    # host_call is computed in the forward of each step, before that step's update
    assert w0 == pytest.approx([1.0, 2.1, w0[2]])
    assert len(rec.last.losses) == 3 and rec.last.losses[0] == pytest.approx((4 + 9) / 2)


def test_host_call_tuple_form():
    def fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        spec = linear_fn(model, features, labels, mode, params)
        spec.host_call = (lambda w: {"w_mean": float(w.mean())}, [model.weight.detach()[0, 0]])
        return spec

    est = linear_estimator(iterations_per_loop=2)
    est.model_fn = fn
    rec = Recorder()
    est.train(whole_batch, max_steps=2, hooks=[rec])
    assert rec.last.values["w_mean"] == [pytest.approx((1.0 + 2.1) / 2)]


def test_a_hook_can_stop_training():
    class StopAt7(Hook):
        def after_loop(self, run, result):  # noqa: ANN001
            if run.global_step >= 7:
                run.request_stop("enough")

    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=3)
    est.train(train_input(x, y), max_steps=100, hooks=[StopAt7()])
    assert est.global_step == 9  # stops at the first loop boundary after the request


def test_training_ends_when_the_data_ends():
    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=3)
    est.train(
        lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(num_epochs=2).for_replica(p)), max_steps=100
    )
    assert est.global_step == 8  # 2 epochs x 4 batches of 16


def test_gradient_accumulation_matches_the_full_batch():
    x, y = make_data(64)
    full = make_estimator(batch=16, opt="momentum", schedule=False, params={})
    full.train(train_input(x, y), max_steps=6)
    acc = make_estimator(batch=16, opt="momentum", schedule=False, gradient_accumulation_steps=2)
    # dropout draws differ with two half batches; compare without dropout
    full_nd = make_estimator(batch=16, opt="momentum", schedule=False)
    for e in (full_nd, acc):
        e.model.drop.p = 0.0
    full_nd.train(train_input(x, y), max_steps=6)
    acc.train(train_input(x, y), max_steps=6)
    for a, b in zip(full_nd.model.parameters(), acc.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_params_batch_size_is_per_replica_and_accumulation_step():
    seen = {}

    def input_fn(params):  # noqa: ANN001, ANN202
        seen.update(params)
        x, y = make_data(64)
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions().for_replica(params))

    est = make_estimator(batch=32, gradient_accumulation_steps=4)
    est.train(input_fn, max_steps=1)
    assert seen["batch_size"] == 8 and seen["num_replicas"] == 1 and seen["replica_index"] == 0


def test_global_batch_not_divisible_names_both_numbers():
    with pytest.raises(
        ValueError, match=r"train_batch_size=30 is not divisible by 4 \(1 replicas x 4 accumulation steps\)"
    ):
        make_estimator(batch=30, gradient_accumulation_steps=4)


def test_steps_and_max_steps_together_is_an_error():
    x, y = make_data(64)
    with pytest.raises(ValueError, match="steps or max_steps, not both"):
        make_estimator().train(train_input(x, y), steps=1, max_steps=2)


def test_eval_is_exact_on_a_ragged_last_batch():
    x, y = make_data(203)
    est = make_estimator()
    est.train(train_input(x, y), max_steps=10)
    ragged = est.evaluate(eval_input(x, y))  # 203 = 12 x 16 + 11
    model = est.model.eval()
    with torch.no_grad():
        logits = model(x)
    whole_loss = torch.nn.functional.cross_entropy(logits.double(), y).item()
    assert ragged["accuracy"] == (logits.argmax(-1) == y).double().mean().item()
    assert ragged["top2"] == (logits.topk(2).indices == y[:, None]).any(-1).double().mean().item()
    assert ragged["loss"] == pytest.approx(whole_loss, rel=1e-6)
    est2 = stoker.Estimator(
        model=lambda p: est.model,
        model_fn=est.model_fn,
        config=stoker.RunConfig(progress_bar=False),
        eval_batch_size=203,
    )
    est2.initialize()
    assert est2.evaluate(eval_input(x, y))["accuracy"] == ragged["accuracy"]


def test_evaluate_steps_limits_batches():
    x, y = make_data(100)
    est = make_estimator()
    est.train(train_input(x, y), max_steps=2)
    model = est.model.eval()
    with torch.no_grad():
        acc = (model(x[:32]).argmax(-1) == y[:32]).double().mean().item()
    assert est.evaluate(eval_input(x, y), steps=2)["accuracy"] == acc


def test_predict_drops_padding_and_keeps_order():
    x, y = make_data(37)
    est = make_estimator(batch=16)
    est.train(train_input(x, y), max_steps=3)
    rows = list(est.predict(eval_input(x)))
    assert len(rows) == 37
    with torch.no_grad():
        expected = est.model.eval()(x)
    torch.testing.assert_close(torch.stack([r["logits"] for r in rows]), expected)
    batches = list(est.predict(eval_input(x), yield_single_examples=False))
    assert [b["classes"].shape[0] for b in batches] == [16, 16, 5]


def test_predict_pads_to_a_static_batch():
    shapes = []

    def fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        shapes.append(tuple(features.shape))
        return stoker.EstimatorSpec(predictions={"s": features.sum(-1)})

    est = stoker.Estimator(
        model=nn.Identity(), model_fn=fn, config=stoker.RunConfig(progress_bar=False), predict_batch_size=8
    )
    est.initialize()
    out = list(
        est.predict(
            lambda p: stoker.data.arrays(
                torch.arange(20.0).reshape(10, 2),
                read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p),
            )
        )
    )
    assert shapes == [(8, 2), (8, 2)]
    assert [float(r["s"]) for r in out] == [float(2 * i + 2 * i + 1) for i in range(10)]


def test_bf16_trains_and_keeps_fp32_master_weights():
    x, y = make_data(64)
    est = make_estimator(precision="bf16")
    est.train(train_input(x, y), max_steps=4)
    assert all(p.dtype == torch.float32 for p in est.model.parameters())


def test_static_loss_scale_fp16():
    x, y = make_data(64)
    est = make_estimator(precision="fp16", loss_scale=128)
    est.train(train_input(x, y), max_steps=4)
    assert est.state.scaler.scale == 128 and not est.state.scaler.dynamic
    assert all(torch.isfinite(p).all() for p in est.model.parameters())


def test_dynamic_loss_scale_halves_and_grows():
    x, y = make_data(64)
    est = make_estimator(precision="fp16", loss_scale=stoker.LossScale(init=2.0**40, growth_interval=2))
    before = {k: v.clone() for k, v in est.model.state_dict().items()}
    est.train(train_input(x, y), max_steps=1)
    # 2**40 overflows fp16 gradients: the update is skipped and the scale halved
    assert est.state.scaler.skipped_steps == 1 and est.state.scaler.scale == 2.0**39
    assert all(torch.equal(before[k], v) for k, v in est.model.state_dict().items())
    scaler = stoker.precision.LossScaler(dynamic=True, init_scale=4.0, growth_interval=2)
    assert [scaler.step_ok(torch.tensor(0.0)) for _ in range(2)] == [True, True] and scaler.scale == 8.0
    assert scaler.step_ok(torch.tensor(1.0)) is False and scaler.scale == 4.0


def test_initialize_lets_a_never_trained_estimator_predict(tmp_path):
    x, _ = make_data(5)
    est = make_estimator(tmp_path)
    with pytest.raises(stoker.CheckpointError, match="has not been trained"):
        list(est.predict(eval_input(x)))
    est.initialize()
    with torch.no_grad():
        expected = est.model.eval()(x)
    torch.testing.assert_close(torch.stack([r["logits"] for r in est.predict(eval_input(x))]), expected)


def test_log_every_n_steps_none_turns_the_log_lines_off():
    x, y = make_data(64)
    est = make_estimator(log_every_n_steps=None)
    assert not any(type(h).__name__ in ("LoggingHook", "StepCounterHook") for h in est.default_hooks())
    est.train(train_input(x, y), max_steps=3)


def test_the_estimator_records_what_it_chose_when_built():
    """``Estimator.choices``: each setting's rule applied once at build, with the reason a front end prints."""
    from stoker.resolve import Choice

    if torch.cuda.is_available():
        pytest.skip("the auto device is a GPU here")
    est = linear_estimator(fast_linear="auto", sgd_in_backward="auto")
    assert est.choices == {
        "device": Choice(torch.device("cpu"), "auto: torch sees no CUDA device"),
        "fast_linear": Choice("auto", "per layer shape, oneDNN or the BLAS, whichever measured faster here; cached"),
        "sgd_in_backward": Choice("auto", "in the fast linear layers that allow it, chosen at the first step"),
        "cuda_graph": Choice(False, "CUDA only"),
    }
    bf16 = linear_estimator(device="cpu", precision="bf16", fast_linear="on", sgd_in_backward="auto").choices
    assert bf16["device"] == Choice(torch.device("cpu"), "RunConfig.device='cpu'")
    assert bf16["fast_linear"] == Choice("on", "RunConfig.fast_linear='on'")
    assert bf16["sgd_in_backward"] == Choice("off", "it needs RunConfig.precision='fp32' (got bf16)")
    assert linear_estimator().choices["sgd_in_backward"] == Choice("off", "RunConfig.sgd_in_backward='off'")


def test_the_evaluation_hook_on_a_schedule_of_periods_and_steps_from_a_first_step(tmp_path):
    """Several periods and given steps, counted from ``first_step`` (stoker bench's tf_cnn schedule):
    loops end at each, none before ``first_step``, the last at the end; every hook hears each."""
    from stoker.estimator import EvaluationHook

    class Heard(Hook):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def after_evaluation(self, run, metrics):  # noqa: ANN001, ANN201
            self.steps.append(metrics["global_step"])

    x, y = make_data(64)
    est = make_estimator(tmp_path / "m", iterations_per_loop=4)
    hook, heard = EvaluationHook(est, eval_input(x, y), [5, 7], 1, at_steps=[2], first_step=3), Heard()
    assert [hook.scheduled_after(s) for s in (0, 5, 8, 10, 13, 17)] == [5, 8, 10, 13, 17, 18]
    est.train(train_input(x, y), max_steps=16, hooks=[hook, heard])
    assert heard.steps == [5, 8, 10, 13, 16]
    assert hook.last_results is not None and hook.last_results["global_step"] == 16


@pytest.mark.parametrize("every", [0, -2, 1.5, True])  # None: the default interval (1000)
def test_train_and_evaluate_refuses_an_interval_that_is_not_a_positive_integer(every):
    est = make_estimator()
    x, y = make_data(32)
    with pytest.raises(
        stoker.ConfigError, match=rf"^train_and_evaluate: eval_every_n_steps must be a positive integer; got {every!r}$"
    ):
        est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=4, eval_every_n_steps=every)
    assert est.global_step == 0
