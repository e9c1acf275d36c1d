"""LoRA (PEFT) adapters on a frozen base, with checkpoints that hold the adapters only.

:func:`with_lora` is the Estimator's ``model=``: it builds the base (from its folder or config),
wraps it with ``peft.get_peft_model`` (the base frozen, the adapters and any
``modules_to_save`` trainable) and makes the result :func:`adapters_only`: its ``state_dict``
holds the trainable parameters alone, so every checkpoint is the size of the adapters, not of
the model. The frozen base is not in the checkpoints: it is built again, the same, at every
start (from the same folder, or from the same config and ``RunConfig.seed``), and a fingerprint
of it (a hash of a sample of every frozen tensor) is kept beside the adapters, so a resume on
another base is refused rather than trained on. Resume is exact: the adapters, their optimizer
state and every RNG are in the checkpoint, and the base is bitwise the one before.

Adapter checkpoints run in one process or replicated (DDP); a sharded (FSDP2) run trains the
whole model. :func:`stoker.hf.save_pretrained` merges the adapters into the base and writes an
ordinary ``save_pretrained`` folder, or writes PEFT's adapter folder.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointMismatchError, ConfigError
from .model import ModelBuilder

#: The state_dict entry that holds the frozen base's fingerprint (32 bytes of a sha256).
FINGERPRINT_KEY = "frozen_base.fingerprint"
#: Elements of each frozen tensor hashed into the fingerprint (evenly spaced; all of a smaller one).
SAMPLED_ELEMENTS = 1024


@dataclass(frozen=True)
class WithLora:
    """The Estimator's ``model=``: ``base`` built, wrapped with PEFT's ``config``, adapters only
    in its state (made by :func:`with_lora`)."""

    base: ModelBuilder
    config: Any  # a peft.PeftConfig (LoraConfig, ...)

    def __call__(self, params: Mapping[str, Any]) -> nn.Module:
        from peft import get_peft_model

        # Built after stoker seeds: the base's new heads and the adapters' initial weights are the same every run.
        return adapters_only(get_peft_model(self.base(params), copy.deepcopy(self.config)))  # peft writes into it


def with_lora(base: ModelBuilder, config: Any) -> WithLora:
    """The Estimator's ``model=``: ``base`` with PEFT adapters, checkpointed adapters only.

    Args:
        base: builds the base model from ``params`` (:func:`~stoker.hf.from_pretrained`,
            :func:`~stoker.hf.from_config`, or any ``params -> nn.Module``); it must build the
            same weights every time (it is not in the checkpoints).
        config: a ``peft.LoraConfig`` (or another ``PeftConfig``), e.g.
            ``LoraConfig(r=8, target_modules=["q_lin", "v_lin"], task_type="SEQ_CLS")``.
    """
    if not hasattr(config, "peft_type"):
        raise ConfigError(
            f"with_lora: config must be a peft.PeftConfig such as LoraConfig; got {type(config).__name__}"
        )
    return WithLora(base, config)


def adapters_only(model: nn.Module) -> nn.Module:
    """``model``, whose ``state_dict`` now holds its trainable parameters only, plus a fingerprint
    of the frozen rest (:data:`FINGERPRINT_KEY`); ``load_state_dict`` takes such a state, refuses
    one whose fingerprint differs, and leaves the frozen weights as they are.

    Which parameters are trainable is read now (``requires_grad``); call it after freezing.
    """
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if not trainable:
        raise ConfigError("adapters_only: the model has no trainable parameter (freeze the base, not everything)")
    fingerprint: list[torch.Tensor] = []  # computed at the first use: after warm start and precision

    def frozen_fingerprint() -> torch.Tensor:
        if not fingerprint:
            fingerprint.append(_fingerprint(model, trainable))
        return fingerprint[0]

    def keep_trainable(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for key in [k for k in state if k[len(prefix) :] not in trainable]:
            del state[key]
        state[prefix + FINGERPRINT_KEY] = frozen_fingerprint().clone()

    def check_base(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        saved = state.pop(prefix + FINGERPRINT_KEY, None)
        if saved is not None and not torch.equal(torch.as_tensor(saved).cpu(), frozen_fingerprint()):
            raise CheckpointMismatchError(
                "the adapters were trained on another base model (the frozen weights' fingerprint differs): "
                "build the base from the folder or config and seed the run was started with"
            )

    def forgive_frozen(module: nn.Module, incompatible: Any) -> None:
        incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k in trainable]

    model.register_state_dict_post_hook(keep_trainable)
    model.register_load_state_dict_pre_hook(check_base)
    model.register_load_state_dict_post_hook(forgive_frozen)
    return model


def _fingerprint(model: nn.Module, trainable: set[str]) -> torch.Tensor:
    """sha256 of every frozen tensor's name, shape, dtype and a sample of its values, as 32 uint8."""
    digest = hashlib.sha256()
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        if name in trainable:
            continue
        if type(tensor.data) is not torch.Tensor:  # a DTensor: sharded
            raise ConfigError(
                "with_lora / adapters_only: the model is sharded (strategy 'sharded'); adapter checkpoints run "
                "in one process or replicated"
            )
        flat = tensor.detach().reshape(-1)
        if flat.numel() > SAMPLED_ELEMENTS:
            flat = flat[torch.linspace(0, flat.numel() - 1, SAMPLED_ELEMENTS, device=flat.device).long()]
        digest.update(f"{name}:{list(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(flat.float().cpu().numpy().tobytes())
    return torch.from_numpy(np.frombuffer(digest.digest(), dtype=np.uint8).copy())


__all__ = ["FINGERPRINT_KEY", "WithLora", "adapters_only", "with_lora"]
