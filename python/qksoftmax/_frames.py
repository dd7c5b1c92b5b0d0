"""What qksoftmax needs from an array framework (numpy or torch), behind one interface.

A call's Frame is taken from its first tensor, q: every other tensor must be of the same framework, on the
same device, and outputs and the workspace are allocated there. torch is imported only by a TorchFrame.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _C

NO_STREAM = 0  # the stream argument of a CPU call


def type_name(x: object) -> str:
    """The qualified name of x's type, as messages show it: list, numpy.ndarray, torch.Tensor."""
    cls = type(x)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


class Frame(ABC):
    """The framework and device of one call (`where`, e.g. "qksoftmax.forward"), taken from q."""

    kind: str  # the array type every tensor of the call must have, as messages name it
    dtypes: tuple[Any, ...]  # the supported dtypes, q's included
    float32: Any

    def __init__(self, where: str, q: Any) -> None:
        self.where = where
        self.q = q
        self.check_device_of_q()
        if q.dtype not in self.dtypes:
            raise self.error(TypeError, f"q must have dtype {self.dtypes_text()}, got {q.dtype}")

    def error(self, exc_type: type[Exception], message: str) -> Exception:
        return exc_type(f"{self.where}: {message}")

    def dtypes_text(self) -> str:
        names = [str(dtype) for dtype in self.dtypes]
        return ", ".join(names[:-1]) + " or " + names[-1]

    def check(self, name: str, x: Any, dtype: Any, like: str = "") -> None:
        """x must be of q's framework, on q's device, with this dtype (`like` names where it comes from)."""
        if not self.is_mine(x):
            raise self.error(TypeError, f"{name} must be a {self.kind} like q, got {type_name(x)}")
        if self.device(x) != self.device(self.q):
            raise self.error(ValueError, f"{name} must be on {self.device(self.q)} like q, got {self.device(x)}")
        if x.dtype != dtype:
            source = f" like {like}" if like else ""
            raise self.error(TypeError, f"{name} must have dtype {dtype}{source}, got {x.dtype}")

    def workspace(self, nbytes: int) -> Any:
        """nbytes of scratch memory on q's device, aligned as the C++ API asks; None when nbytes is 0."""
        if nbytes == 0:
            return None
        alignment = _C.WORKSPACE_ALIGNMENT
        raw = self.raw_bytes(nbytes + alignment - 1)
        offset = -self.address(raw) % alignment
        return raw[offset : offset + nbytes]

    def check_device_of_q(self) -> None:
        """Raises ValueError when q is on a device that qksoftmax does not run on."""

    @abstractmethod
    def is_mine(self, x: object) -> bool: ...

    @abstractmethod
    def device(self, x: Any) -> Any: ...

    @abstractmethod
    def prepare(self, x: Any) -> Any:
        """x as the C++ API takes it: a view of x, or a copy where its layout is not accepted."""

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any: ...

    @abstractmethod
    def raw_bytes(self, nbytes: int) -> Any: ...

    @abstractmethod
    def address(self, buffer: Any) -> int: ...

    @abstractmethod
    def launch(self) -> contextlib.AbstractContextManager[int]:
        """Context of the C++ call: yields the stream to pass (NO_STREAM on the CPU)."""


class NumpyFrame(Frame):
    kind = "numpy.ndarray"
    dtypes = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
    float32 = np.dtype(np.float32)

    def dtypes_text(self) -> str:
        return super().dtypes_text() + " (numpy has no bfloat16)"

    def is_mine(self, x: object) -> bool:
        return isinstance(x, np.ndarray)

    def device(self, x: np.ndarray) -> str:
        return "cpu"

    def prepare(self, x: np.ndarray) -> np.ndarray:
        # The C++ API takes non-negative strides in whole elements; the CPU backend any such layout.
        in_elements = all(stride >= 0 and stride % x.itemsize == 0 for stride in x.strides)
        return x if in_elements and x.flags.aligned else np.ascontiguousarray(x)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    def raw_bytes(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def address(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    @contextlib.contextmanager
    def launch(self) -> Iterator[int]:
        yield NO_STREAM


class TorchFrame(Frame):
    kind = "torch.Tensor"
    devices = ("cpu", "cuda")

    def __init__(self, where: str, q: Any) -> None:
        import torch

        self.torch = torch
        self.dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
        self.float32 = torch.float32
        super().__init__(where, q)
        if q.dtype == torch.float64 and q.device.type == "cuda":
            raise self.error(
                NotImplementedError, f"q has dtype torch.float64 on {q.device}: float64 runs on the CPU backend only"
            )

    def check_device_of_q(self) -> None:
        self.check_strided("q", self.q)
        if self.q.device.type not in self.devices:
            raise self.error(ValueError, f"q must be on the CPU or a CUDA device, got {self.q.device}")

    def check(self, name: str, x: Any, dtype: Any, like: str = "") -> None:
        super().check(name, x, dtype, like)
        self.check_strided(name, x)

    def check_strided(self, name: str, x: Any) -> None:
        """Sparse and other non-strided layouts have no strides to describe."""
        if x.layout != self.torch.strided:
            raise self.error(TypeError, f"{name} must be a strided (dense) torch.Tensor, got layout {x.layout}")

    def is_mine(self, x: object) -> bool:
        return isinstance(x, self.torch.Tensor)

    def device(self, x: Any) -> Any:
        return x.device

    def prepare(self, x: Any) -> Any:
        # On CUDA the C++ API needs the last dimension dense; the CPU backend takes any strides.
        x = x.detach()
        if x.device.type == "cuda" and x.dim() > 0 and x.size(-1) > 1 and x.stride(-1) != 1:
            x = x.contiguous()
        return x

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.empty(shape, dtype=dtype, device=self.q.device)

    def raw_bytes(self, nbytes: int) -> Any:
        return self.empty((nbytes,), self.torch.uint8)

    def address(self, buffer: Any) -> int:
        return buffer.data_ptr()

    @contextlib.contextmanager
    def launch(self) -> Iterator[int]:
        device = self.q.device
        if device.type != "cuda":
            yield NO_STREAM
            return
        with self.torch.cuda.device(device):
            yield self.torch.cuda.current_stream(device).cuda_stream


def numpy_frame(where: str, q: object) -> NumpyFrame:
    """The Frame of a call whose first tensor is q, not a torch.Tensor (those go through _ops)."""
    if isinstance(q, np.ndarray):
        return NumpyFrame(where, q)
    raise TypeError(f"{where}: q must be a torch.Tensor or numpy.ndarray, got {type_name(q)}")
