"""The one device rule (``stoker.distributed.device_choice``): what each name means, and errors
that name the settings in the words of the front end that shows them."""

from __future__ import annotations

import pytest
import torch

from stoker.distributed import device_choice, resolve_device
from stoker.errors import ConfigError
from stoker.resolve import Choice, Names, spelled

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the auto device is a GPU here")


class Flags(Names):
    def field(self, name: str) -> str:
        return f"--{name}"

    def value(self, value: object) -> str:
        return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


@needs_no_cuda
def test_auto_and_cpu_on_a_machine_without_cuda() -> None:
    assert device_choice("auto") == Choice(torch.device("cpu"), "auto: torch sees no CUDA device")
    assert device_choice("cpu") == Choice(torch.device("cpu"), "RunConfig.device='cpu'")
    assert resolve_device("auto") == torch.device("cpu")


@needs_no_cuda
def test_a_cuda_name_without_cuda_and_indices_on_the_cpu_are_errors_naming_the_settings() -> None:
    with pytest.raises(ConfigError) as e:
        device_choice("cuda")
    assert str(e.value) == "RunConfig.device='cuda', but torch sees no CUDA device; use RunConfig.device='cpu'"
    assert spelled(e.value, Flags()) == "--device=cuda, but torch sees no CUDA device; use --device=cpu"
    with pytest.raises(ConfigError) as e:
        device_choice("auto", indices=(0, 1))
    assert spelled(e.value, Flags()) == "--gpu_indices=0,1 names CUDA devices, but the device is the CPU (--device=cpu)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_is_this_replica_s_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert device_choice("cuda").value == torch.device("cuda", 0)
    assert device_choice("auto", indices=(0,)) == Choice(
        torch.device("cuda", 0), "RunConfig.gpu_indices=(0,), replica 0"
    )
    with pytest.raises(ConfigError, match="replica 1 needs an entry"):
        monkeypatch.setenv("LOCAL_RANK", "1")
        device_choice("cuda", indices=(0,))
