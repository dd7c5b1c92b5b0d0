"""What qksoftmax needs from an array framework (numpy or torch), in two parts.

A Runner (NUMPY) is what every call through _core does on numpy arrays: lay inputs out as the C++ API takes
them, allocate outputs and the workspace, launch a plan. It checks nothing: the C++ API validates each call
once. (Torch tensors need no Runner: qksoftmax._C.torch_forward / torch_backward allocate and launch in C++.)

A Frame (one per failed call, taken from its first tensor q) is what the checks need to phrase an error in
Python terms: every other tensor must be of q's framework, on q's device, of a supported dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from . import _C

NO_STREAM = 0  # the stream argument of a CPU call
NO_WORKSPACE = 0


def type_name(x: object) -> str:
    """The qualified name of x's type, as messages show it: list, numpy.ndarray, torch.Tensor."""
    cls = type(x)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def aligned_address(buffer_address: int) -> int:
    """The first address at or after buffer_address aligned as the C++ API asks of a workspace."""
    return buffer_address + -buffer_address % _C.WORKSPACE_ALIGNMENT


class Runner(ABC):
    """How calls run on one framework's arrays."""

    float32: Any

    @abstractmethod
    def prepare(self, x: Any) -> Any:
        """x as the C++ API takes it: x itself, or a copy where its layout is not accepted."""

    @abstractmethod
    def empty(self, q: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array of q's framework, on q's device."""

    @abstractmethod
    def launch(self, plan: _C.Plan, q: Any) -> None:
        """Runs a plan whose tensors are on q's device, with a workspace allocated there."""

    @abstractmethod
    def frame(self, where: str, q: Any) -> Frame:
        """The Frame of a call (named `where`) whose first tensor is q; raises if q cannot be one."""


class NumpyRunner(Runner):
    float32 = np.dtype(np.float32)

    def prepare(self, x: np.ndarray) -> np.ndarray:
        # The C++ API takes non-negative strides in whole elements; the CPU backend any such layout.
        in_elements = all(stride >= 0 and stride % x.itemsize == 0 for stride in x.strides)
        if in_elements and x.flags.aligned:
            return x
        # A fresh allocation, aligned and contiguous (np.ascontiguousarray keeps a contiguous misaligned view).
        return np.array(x, order="C")

    def empty(self, q: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    def launch(self, plan: _C.Plan, q: np.ndarray) -> None:
        nbytes = plan.workspace_bytes  # 0: the CPU backend needs none
        workspace = np.empty(nbytes + _C.WORKSPACE_ALIGNMENT - 1, np.uint8) if nbytes else None
        address = aligned_address(workspace.ctypes.data) if nbytes else NO_WORKSPACE
        plan.run(address, nbytes, NO_STREAM)

    def frame(self, where: str, q: Any) -> Frame:
        return numpy_frame(where, q)


NUMPY = NumpyRunner()


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

    def check_device_of_q(self) -> None:
        """Raises ValueError when q is on a device that qksoftmax does not run on."""

    @abstractmethod
    def is_mine(self, x: object) -> bool: ...

    @abstractmethod
    def device(self, x: Any) -> Any: ...


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
        import torch

        return isinstance(x, torch.Tensor)

    def device(self, x: Any) -> Any:
        return x.device


def numpy_frame(where: str, q: object) -> NumpyFrame:
    """The Frame of a call whose first tensor is q, not a torch.Tensor (those go through _ops)."""
    if isinstance(q, np.ndarray):
        return NumpyFrame(where, q)
    raise TypeError(f"{where}: q must be a torch.Tensor or numpy.ndarray, got {type_name(q)}")
