"""The learning-rate schedules a model's registry entry names: exact rates at the steps where
they change, and every registered model's entry holding a schedule that runs."""

from __future__ import annotations

import pytest

from stoker.errors import UnknownNameError
from stoker.models import DATASETS, LR_SCHEDULES, get_model_info, list_models, register_model
from stoker.models.schedules import describe_learning_rate, learning_rate_schedule

REGISTERED = [(d, n) for d in DATASETS for n in list_models(d)]


def rate(name: str, dataset: str, global_batch: int, **kw: float) -> object:
    return learning_rate_schedule(get_model_info(name, dataset), global_batch, **kw)


def test_resnet_warms_up_for_5_epochs_then_steps_down_at_30_60_80_90() -> None:
    lr = rate("resnet50", "imagenet", 256)  # 5004.56 steps per epoch: 25022 warm-up steps
    assert [lr(0), lr(12511), lr(25022)] == [0.0, 0.064, 0.128]
    assert lr(150136) == 0.128 and lr(150137) == pytest.approx(0.0128)  # TF's piecewise: <= the boundary
    assert lr(450410) == pytest.approx(0.128e-3) and lr(450411) == pytest.approx(0.128e-4)
    assert rate("resnet50", "imagenet", 256, base_lr=0.256)(25022) == 0.256  # --resnet_base_lr
    assert rate("resnet50", "imagenet", 512)(50044) == 0.256  # scaled with the global batch


def test_official_resnet_scales_by_its_own_batch_without_warm_up() -> None:
    lr = rate("official_resnet50", "imagenet", 256)  # 0.05 at batch 128
    assert lr(0) == 0.1 and lr(150136) == 0.1 and lr(150137) == pytest.approx(0.01)
    assert rate("official_resnet50", "imagenet", 256, base_lr=1.0)(0) == 0.1  # base_lr: the resnet kind only


def test_cifar_schedules_step_at_their_epochs() -> None:
    resnet = rate("resnet20", "cifar10", 128)  # 390 steps per epoch
    assert [resnet(31980), resnet(31981), resnet(47971), resnet(117001)] == [0.1, 0.01, 0.001, 0.0002]
    densenet = rate("densenet40_k12", "cifar10", 64)  # 781 steps per epoch
    assert [densenet(117150), densenet(117151), densenet(234301)] == [0.1, 0.01, 0.0001]
    alexnet = rate("alexnet", "cifar10", 128)  # x0.1 every 39062 steps
    assert alexnet(39061) == 0.1 and alexnet(39062) == pytest.approx(0.01)


def test_ssd_warms_up_then_steps_at_160k_and_200k_steps_of_32() -> None:
    lr = rate("ssd300", "coco", 32)  # 18482 warm-up steps
    assert [lr(9241), lr(18482), lr(160000), lr(160001), lr(200001)] == pytest.approx(
        [0.0005, 0.001, 0.001, 0.0001, 0.00001]
    )


def test_descriptions_name_the_model_and_the_rate() -> None:
    def said(name: str, dataset: str = "imagenet") -> str:
        return describe_learning_rate(get_model_info(name, dataset))

    assert said("trivial") == "trivial's learning rate: 0.005"
    assert said("official_resnet50").startswith("official_resnet50's learning rate: 0.05 x global batch / 128")
    assert (
        said("resnet20", "cifar10")
        == "resnet20's learning rate: 0.1, then 0.01, 0.001, 0.0002 from epochs 82, 123, 300"
    )


@pytest.mark.parametrize("key", REGISTERED, ids=lambda key: f"{key[0]}-{key[1]}")
def test_every_entry_with_a_rate_has_a_schedule_that_runs(key: tuple[str, str]) -> None:
    info = get_model_info(key[1], key[0])
    assert info.lr_schedule in LR_SCHEDULES
    if info.default_learning_rate is None:  # tf_cnn_benchmarks does not define it: the bench's fallback
        assert info.lr_schedule == "constant" and info.default_batch_size is None
        with pytest.raises(ValueError, match="no learning rate of its own"):
            learning_rate_schedule(info, 32)
        return
    lr = learning_rate_schedule(info, info.default_batch_size or 32)
    rates = [lr(step) for step in (0, 10**3, 10**4, 10**5, 10**6)]
    assert all(0.0 <= r <= 1.0 for r in rates) and max(rates) > 0
    if info.lr_schedule == "constant":
        assert rates == [info.default_learning_rate] * len(rates)
    assert describe_learning_rate(info).startswith(f"{info.name}'s learning rate: ")


def test_an_unknown_schedule_kind_is_refused_at_registration() -> None:
    with pytest.raises(UnknownNameError, match="unknown lr_schedule 'cosine'; allowed: constant, resnet"):
        register_model("cosine_net", dataset="cifar10", default_image_size=32, lr_schedule="cosine")
