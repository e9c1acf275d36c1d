"""EstimatorSpec.predictions given as a function: computed only where stoker reads it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import stoker
from helpers.tiny import TinyNet, eval_input, make_data, train_input


def tpu_style_fn(lazy: bool, calls: dict[str, int]):  # noqa: ANN201
    def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        logits = model(features)

        def predictions() -> dict[str, torch.Tensor]:
            calls[str(mode)] = calls.get(str(mode), 0) + 1
            return {"classes": logits.argmax(-1), "probabilities": logits.softmax(-1)}

        loss = (
            None if labels is None else F.cross_entropy(logits, labels, reduction="mean" if mode == "train" else "none")
        )
        return stoker.EstimatorSpec(loss=loss, predictions=predictions if lazy else predictions())

    return model_fn


def estimator(tmp_path, lazy: bool, calls: dict[str, int]) -> stoker.Estimator:  # noqa: ANN001
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=tpu_style_fn(lazy, calls),
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(model_dir=str(tmp_path), progress_bar=False, iterations_per_loop=3),
        train_batch_size=16,
    )


def test_lazy_predictions_are_computed_only_in_predict_and_equal_the_eager_ones(tmp_path):
    x, y = make_data(64)
    results = {}
    for lazy in (False, True):
        calls: dict[str, int] = {}
        est = estimator(tmp_path / str(lazy), lazy, calls)
        est.train(train_input(x, y), max_steps=7)
        metrics = est.evaluate(eval_input(x, y))
        preds = list(est.predict(eval_input(x[:20])))
        results[lazy] = (est.model.state_dict(), metrics, preds, calls)
    (w_eager, m_eager, p_eager, c_eager), (w_lazy, m_lazy, p_lazy, c_lazy) = results[False], results[True]
    assert c_eager == {"train": 7, "eval": 4, "predict": 2}
    assert c_lazy == {"predict": 2}  # never in TRAIN or EVAL: nothing there reads them
    assert all(torch.equal(w_eager[k], w_lazy[k]) for k in w_eager)
    assert m_eager == m_lazy
    assert len(p_lazy) == 20
    assert all(torch.equal(a[k], b[k]) for a, b in zip(p_eager, p_lazy, strict=True) for k in a)


def test_a_function_is_called_once_and_its_result_kept():
    calls = []
    spec = stoker.EstimatorSpec(predictions=lambda: calls.append(1) or {"a": torch.ones(2)})
    assert calls == []
    assert spec.predictions is spec.predictions
    assert calls == [1]
    assert stoker.EstimatorSpec().predictions is None
