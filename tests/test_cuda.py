"""CUDA paths: the same contracts on a GPU. Skipped cleanly where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import eval_input, make_data, make_estimator, state_equal, train_input
from stoker.precision import LossScale

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "bf16-sr"])
def test_cuda_resume_is_bitwise_equal(tmp_path, precision):
    x, y = make_data(100)
    kw = dict(device="cuda", precision=precision, deterministic=True)
    whole = make_estimator(tmp_path / "w", **kw)
    whole.train(train_input(x, y), max_steps=14)
    make_estimator(tmp_path / "s", **kw).train(train_input(x, y), max_steps=7)
    resumed = make_estimator(tmp_path / "s", **kw)
    resumed.train(train_input(x, y), max_steps=14)
    assert next(resumed.model.parameters()).is_cuda
    assert state_equal(whole.model, resumed.model)


def test_cuda_infeed_copies_on_a_side_stream_and_eval_is_exact(tmp_path):
    x, y = make_data(203)
    est = make_estimator(tmp_path, device="cuda", prefetch_depth=3)
    est.train(train_input(x, y), max_steps=10)
    res = est.evaluate(eval_input(x, y))
    with torch.no_grad():
        logits = est.model.eval()(x.cuda())
    assert res["accuracy"] == (logits.argmax(-1).cpu() == y).double().mean().item()
    rows = list(est.predict(eval_input(x)))
    assert len(rows) == 203 and rows[0]["logits"].device.type == "cpu"


# ---------------------------------------------------------------- RunConfig(cuda_graph=True)
# Written without a GPU to run them on: unverified until a CUDA machine runs this file.


def _graph_estimator(model_dir=None, *, opt="adam_capturable", model_fn=None, dropout=0.0, **config):  # noqa: ANN001, ANN003, ANN202
    import stoker
    from helpers.tiny import TinyNet, classifier_fn

    optimizers = {
        "adam_capturable": lambda p, ps: torch.optim.Adam(ps, lr=0.01, capturable=True),
        "adam_fused": lambda p, ps: torch.optim.Adam(ps, lr=0.01, fused=True),
        "sgd_fused": lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
        "sgd": lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    }
    cfg = dict(
        model_dir=model_dir,
        device="cuda",
        deterministic=True,
        progress_bar=False,
        iterations_per_loop=4,
        log_every_n_steps=10**6,
    )
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: TinyNet(dropout=dropout),
        model_fn=model_fn or classifier_fn,
        optimizer=optimizers[opt],
        lr_schedule=lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),
        config=stoker.RunConfig(**cfg),
        train_batch_size=16,
    )


def _assert_close(a, b, rtol=1e-5, atol=1e-6):  # noqa: ANN001, ANN202
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=rtol, atol=atol)


@pytest.mark.parametrize("opt", ["adam_capturable", "adam_fused", "sgd_fused"])
def test_cuda_graph_loop_matches_the_eager_loop(opt, caplog):
    import logging

    x, y = make_data(200)
    eager = _graph_estimator(opt=opt)
    eager.train(train_input(x, y), max_steps=20)
    graphed = _graph_estimator(opt=opt, cuda_graph=True)
    with caplog.at_level(logging.INFO, logger="stoker"):
        graphed.train(train_input(x, y), max_steps=20)
    assert any("captured the training step" in r.getMessage() for r in caplog.records)
    assert not any("running the step eagerly" in r.getMessage() for r in caplog.records)
    _assert_close(eager, graphed)
    assert graphed.state.optimizer.param_groups[0]["lr"] == eager.state.optimizer.param_groups[0]["lr"]


def test_cuda_graph_resume_and_checkpoints(tmp_path):
    x, y = make_data(200)
    whole = _graph_estimator(tmp_path / "w", cuda_graph=True)
    whole.train(train_input(x, y), max_steps=14)
    _graph_estimator(tmp_path / "s", cuda_graph=True).train(train_input(x, y), max_steps=7)
    resumed = _graph_estimator(tmp_path / "s", cuda_graph=True)
    resumed.train(train_input(x, y), max_steps=14)
    assert state_equal(whole.model, resumed.model)
    # an eager run resumes the graph run's checkpoint (same format) and agrees with an eager run
    eager_whole = _graph_estimator()
    eager_whole.train(train_input(x, y), max_steps=14)
    eager_resumed = _graph_estimator(tmp_path / "s")
    eager_resumed.train(train_input(x, y), max_steps=21)
    graph_more = _graph_estimator(tmp_path / "w", cuda_graph=True)
    graph_more.train(train_input(x, y), max_steps=21)
    _assert_close(eager_resumed, graph_more)
    _assert_close(eager_whole, whole)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_graph_loops_cut_at_scheduled_steps_change_no_number(tmp_path, precision):
    # Loops end at every step a hook is scheduled at (docs/device_loop.md): loops of 4 cut at
    # each multiple of 3 (checkpoints) replay the captured step as loops of 1 do; fp16's loss
    # scale, kept on the device and read once per loop, ends the same too.
    x, y = make_data(200)
    kw = dict(opt="adam_fused", precision=precision)
    if precision == "fp16":
        kw.update(loss_scale=LossScale(init=2.0**24, growth_interval=3))
    one = _graph_estimator(tmp_path / "one", cuda_graph=True, iterations_per_loop=1, **kw)
    one.train(train_input(x, y), max_steps=20)
    cut = _graph_estimator(tmp_path / "cut", cuda_graph=True, iterations_per_loop=4, save_checkpoints_steps=3, **kw)
    cut.train(train_input(x, y), max_steps=20)
    assert state_equal(one.model, cut.model)
    assert one.state.scaler is None or one.state.scaler.state_dict() == cut.state.scaler.state_dict()


def test_cuda_graph_fp16_dynamic_scaling_stays_on_the_device(tmp_path):
    x, y = make_data(200)
    kw = dict(
        opt="adam_fused",
        precision="fp16",
        loss_scale=LossScale(init=2.0**24, growth_interval=3),
        gradient_clip_norm=0.5,
    )
    eager = _graph_estimator(tmp_path / "e", **kw)
    eager.train(train_input(x, y), max_steps=16)
    graphed = _graph_estimator(tmp_path / "g", cuda_graph=True, **kw)
    graphed.train(train_input(x, y), max_steps=16)
    assert graphed.state.scaler.skipped_steps > 0
    assert graphed.state.scaler.state_dict() == eager.state.scaler.state_dict()
    _assert_close(eager, graphed, rtol=1e-3, atol=1e-4)


def test_cuda_graph_falls_back_for_host_syncs_and_refuses_unsupported_settings(caplog):
    import logging

    import torch.nn.functional as F

    import stoker

    def syncing_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        loss = F.cross_entropy(model(features), labels)
        if loss.item() > 100:  # a host sync: cannot be captured
            loss = loss * 0.5
        return stoker.EstimatorSpec(loss=loss)

    x, y = make_data(200)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        est = _graph_estimator(cuda_graph=True, model_fn=syncing_fn)
        est.train(train_input(x, y), max_steps=8)
    assert any("cannot be captured" in r.getMessage() for r in caplog.records)
    eager = _graph_estimator(model_fn=syncing_fn)
    eager.train(train_input(x, y), max_steps=8)
    _assert_close(eager, est)

    from stoker.errors import ConfigError

    with pytest.raises(ConfigError, match="optimizer SGD is not capturable"):  # asked for a graph: no eager run
        _graph_estimator(cuda_graph=True, opt="sgd").train(train_input(x, y), max_steps=2)
