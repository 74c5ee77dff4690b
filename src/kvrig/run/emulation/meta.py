"""The meta device for a model built without a GPU, including what it asks of the GPU by name.

`with torch.device("meta")` places every tensor a layer creates without naming a device,
but some of vLLM's layers name one (a GDN layer's gated norm on
`current_platform.current_device()`, DeepSeek-V3.2's top-k buffer on
`current_platform.device_type`), which would initialise CUDA. While the model is built,
tensors asked for on the GPU go to the meta device too: shapes, dtypes and the KV-cache
specs stay what vLLM asked for. Tensors asked for on the CPU stay there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

_TENSOR_MOVES = {torch.Tensor.to, torch.Tensor.cuda}
_META = torch.device("meta")


def _on_gpu(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):  # a bare index is an accelerator's ordinal
        return True
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        return False
    return kind not in ("cpu", "meta")


class GpuToMeta(TorchFunctionMode):
    """Tensor constructors and moves that name a GPU get the meta device instead."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _device_constructors() and _on_gpu(kwargs.get("device")):
            kwargs["device"] = _META
        elif func in _TENSOR_MOVES:
            if func is torch.Tensor.cuda:
                return args[0].to(_META)
            if _on_gpu(kwargs.get("device")):
                kwargs["device"] = _META
            args = tuple(_META if i > 0 and _on_gpu(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)
