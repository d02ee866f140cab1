"""``neuronxcc.nki.typing`` (``nt``): type annotations for kernel parameters and tiles.

``nt.tensor[shape, dtype]`` (or ``nt.tensor[d0, d1, ...]``) describes a tensor; kernels use
it in annotations (``qk: nt.tensor[128, 128] = nl.matmul(...)``). ``nt.mutable_tensor``
marks a parameter the kernel writes and must return. Annotations are not enforced here.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class TensorType:
    """What ``nt.tensor[...]`` denotes: a shape and, optionally, a dtype."""

    shape: tuple[Any, ...]
    dtype: Any = None
    mutable: bool = False


def _describe(key: Any, mutable: bool) -> TensorType:
    items = key if isinstance(key, tuple) else (key,)
    if len(items) == 2 and isinstance(items[0], (list, tuple)):
        return TensorType(tuple(items[0]), items[1], mutable)
    return TensorType(tuple(items), None, mutable)


class tensor:  # the SDK's (lowercase) name
    """``nt.tensor[...]``: a tensor annotation."""

    def __class_getitem__(cls, key: Any) -> TensorType:
        return _describe(key, mutable=False)


class mutable_tensor(tensor):  # the SDK's (lowercase) name
    """A tensor parameter the kernel writes in place (it must also return it)."""

    def __class_getitem__(cls, key: Any) -> TensorType:
        return _describe(key, mutable=True)
