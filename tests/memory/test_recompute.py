"""Activation recompute: bitwise-equal gradients (dropout included), which modules are chosen,
clear errors, exact saved-activation bytes, and the Estimator path."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import stoker
from helpers.bert import windows
from stoker.memory import SavedActivations
from stoker.memory.recompute import apply_recompute, recomputed_modules, select_modules
from stoker.recipes.bert import BertMLM, MaskedTextWindows, bert_model_fn, mlm_loss


def bert(seed: int = 0, dropout: float = 0.1) -> BertMLM:
    torch.manual_seed(seed)
    return BertMLM(
        hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, dropout=dropout, max_positions=20
    ).train()


def step(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """One forward + backward from a fixed RNG state: loss, gradients, saved activation bytes."""
    torch.manual_seed(123)  # the dropout masks
    with SavedActivations(exclude=[*model.parameters(), *model.buffers()]) as saved:
        loss = mlm_loss(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, saved.bytes


@pytest.mark.parametrize("spec", ["layers.*", "all", ("embeddings", "layers.1", "head.dense")])
def test_recompute_gives_bitwise_the_gradients_of_the_plain_model_with_dropout(spec):
    batch = next(iter(windows()))
    plain_loss, plain_grads, plain_bytes = step(bert(), batch)
    model = bert()
    apply_recompute(model, spec)
    loss, grads, saved = step(model, batch)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    for name, g in grads.items():
        assert torch.equal(g, plain_grads[name]), name
    assert saved < plain_bytes
    # the check can fail: other dropout masks give other gradients
    torch.manual_seed(7)
    other = bert()
    other_loss = mlm_loss(other(batch[0]), batch[1])
    assert not torch.equal(other_loss.detach(), plain_loss)


def test_only_the_outermost_matches_are_wrapped_and_names_do_not_change():
    model = bert()
    before = list(model.state_dict())
    assert select_modules(model, "layers.*") == ["layers.0", "layers.1", "layers.2"]
    assert select_modules(model, ["layers.0.attention", "layers.0"]) == ["layers.0"]
    assert select_modules(model, "layers.?.ffn") == ["layers.0.ffn", "layers.1.ffn", "layers.2.ffn"]
    assert select_modules(model, "all") == [""]
    assert apply_recompute(model, ["layers.1", "head"]) == ["layers.1", "head"]
    assert apply_recompute(model, "layers.1") == ["layers.1"]  # again: not wrapped twice
    assert recomputed_modules(model) == ["layers.1", "head"]
    assert list(model.state_dict()) == before  # checkpoints and exports keep their names


def test_an_unknown_name_is_refused_with_the_available_ones():
    with pytest.raises(
        ValueError,
        match=r"RunConfig.recompute: 'encoder.\*' matches no module of BertMLM; "
        r"its modules are: embeddings, layers, head, .*layers.0, layers.1",
    ):
        apply_recompute(bert(), ["layers.0", "encoder.*"])
    for bad in (5, [], [""], ["layers.*", 3]):
        with pytest.raises(ValueError, match="RunConfig.recompute must be None, 'all', or module-name patterns"):
            stoker.RunConfig(recompute=bad)
    assert stoker.RunConfig(recompute="layers.*").recompute == ("layers.*",)
    assert stoker.RunConfig(recompute=["a", "b"]).recompute == ("a", "b")
    assert stoker.RunConfig(recompute="all").recompute == "all"


def test_saved_activation_bytes_are_exact():
    """Linear -> Tanh -> Linear on x [3, 4] fp32: autograd keeps x (the first Linear's input;
    x needs no grad, so no weight is saved for it) and tanh's output (saved by Tanh and by the
    second Linear: one storage): 2 x 48 bytes. Recomputing the whole model keeps x alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    with SavedActivations(exclude=model.parameters()) as saved:
        model(x).sum().backward()
    assert saved.bytes == 96 and len(saved.storages) == 2
    apply_recompute(model, "all")
    with SavedActivations(exclude=model.parameters()) as saved:
        model(x).sum().backward()
    assert saved.bytes == 48
    with torch.no_grad(), SavedActivations() as saved:
        model(x)
    assert saved.bytes == 0


def test_recompute_through_the_estimator_trains_bitwise_the_same_weights(tmp_path):
    files = [str(p) for p in stoker.data.stdlib_corpus(100_000)]

    def train(recompute: object) -> dict[str, torch.Tensor]:
        est = stoker.Estimator(
            model=lambda p: BertMLM(
                hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, dropout=0.1, max_positions=16
            ),
            model_fn=bert_model_fn,
            optimizer=lambda p, params: torch.optim.AdamW(params, lr=1e-3),
            config=stoker.RunConfig(
                recompute=recompute, iterations_per_loop=2, log_every_n_steps=None, progress_bar=False, device="cpu"
            ),
            train_batch_size=4,
        )
        est.train(
            lambda p: MaskedTextWindows(files, seq_len=16, read=stoker.data.ReadOptions().for_replica(p)), max_steps=4
        )
        assert recomputed_modules(est.model) == ([] if recompute is None else ["layers.0", "layers.1"])
        return est.model_state_dict()

    plain, recomputed = train(None), train("layers.*")
    assert plain.keys() == recomputed.keys()
    for name, value in plain.items():
        assert torch.equal(value, recomputed[name]), name
    with pytest.raises(ValueError, match="matches no module of BertMLM"):
        train("blocks.*")


def test_a_copy_of_the_model_recomputes_its_own_layers():
    """export deep-copies the model: the copy's wrapped forwards must run the copy's weights."""
    model = bert(dropout=0.0)
    apply_recompute(model, "layers.*")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.layers[0].ffn[0].weight.add_(1.0)
    inputs, labels = next(iter(windows()))
    assert not torch.equal(twin(inputs), model(inputs))
    mlm_loss(twin(inputs), labels).backward()
    assert twin.layers[0].ffn[0].weight.grad is not None and model.layers[0].ffn[0].weight.grad is None
    assert recomputed_modules(twin) == ["layers.0", "layers.1", "layers.2"]
