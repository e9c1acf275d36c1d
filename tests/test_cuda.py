"""CUDA paths: the same contracts on a GPU. Skipped cleanly where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch

from conftest import eval_input, make_data, make_estimator, state_equal, train_input

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
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
