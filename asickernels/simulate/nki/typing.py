"""``nki.typing`` (``nt``): annotations for kernel tensor parameters.

``nt.tensor[128, 512]`` (or ``nt.tensor[[128, 512], nl.float32]``) declares a parameter's
shape, and ``nt.mutable_tensor`` a parameter the kernel writes and must return
(nki/migration/index.rst, "nki.typing module"). Annotations document; the simulator checks
shapes and dtypes where the tensors are used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["mutable_tensor", "tensor"]


class TensorAnnotation:
    """``nt.tensor[...]``: a tensor parameter's declared shape (and dtype)."""

    def __init__(self, shape: tuple[int, ...] | None = None, dtype: Any = None) -> None:
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"tensor[{list(self.shape or ())}, {self.dtype}]"


class _TensorType:
    """Subscript it with a shape: ``tensor[128, 512]``, ``tensor[[128, 512], dtype]``."""

    def __init__(self, mutable: bool) -> None:
        self.mutable = mutable

    def __getitem__(self, key: Any) -> TensorAnnotation:
        if isinstance(key, tuple) and key and isinstance(key[0], (list, tuple)):
            return TensorAnnotation(tuple(int(s) for s in key[0]), key[1] if len(key) > 1 else None)
        sizes = key if isinstance(key, tuple) else (key,)
        return TensorAnnotation(tuple(int(s) for s in sizes))

    def __repr__(self) -> str:
        return "mutable_tensor" if self.mutable else "tensor"


tensor = _TensorType(mutable=False)
mutable_tensor = _TensorType(mutable=True)
