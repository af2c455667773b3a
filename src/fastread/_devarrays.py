"""Arrays of row ids and rows across NumPy, PyTorch and CuPy, for
:mod:`fastread.features`: where ids live (host or which GPU), their device
pointers, output allocation, ``out=`` checks and CUDA streams.

CUDA arrays are taken from torch and CuPy directly, and from anything else
through ``__cuda_array_interface__`` or DLPack (converted, without a copy, by
torch if it is installed, else by CuPy). Neither library is imported until
an array of theirs, or a GPU output, needs it.
"""
import sys
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

ID_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13


class Ids(NamedTuple):
    """Row ids as given, made C-contiguous.

    ``lib`` is the library of the array ("numpy", "torch", "cupy"), which
    decides the type of the rows returned; ``device`` the CUDA device of
    device ids (None on the host)."""
    array: object
    lib: str
    device: object
    dtype: np.dtype
    shape: tuple

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ptr(self):
        return _data_ptr(self.array, self.lib)

    def host_int64(self):
        """The ids as a flat C-contiguous int64 NumPy array (copied down from the GPU)."""
        a = self.array
        if is_torch(a):
            a = a.detach().cpu().numpy()
        elif is_cupy(a):
            a = a.get()
        return np.ascontiguousarray(np.asarray(a).reshape(-1), dtype=np.int64)


def _module(obj):
    return type(obj).__module__.split(".", 1)[0]


def is_torch(obj):
    return _module(obj) == "torch" and "torch" in sys.modules and \
        isinstance(obj, sys.modules["torch"].Tensor)


def is_cupy(obj):
    return _module(obj) == "cupy" and "cupy" in sys.modules and \
        isinstance(obj, sys.modules["cupy"].ndarray)


def _np_dtype(lib, dtype):
    if lib == "torch":
        # torch dtypes print as "torch.int64"; NumPy knows the same names.
        name = str(dtype).removeprefix("torch.")
        try:
            return np.dtype(name)
        except TypeError:
            return None  # bfloat16 and other types without a NumPy twin
    return np.dtype(dtype)


def _check_id_dtype(dtype, lib_dtype):
    if dtype is None or dtype not in ID_DTYPES:
        raise TypeError(f"ids must be int32 or int64, got {lib_dtype}")


def default_gpu_lib():
    """The library that holds GPU rows for ids that do not say: torch if it
    imports, else CuPy; None if neither does."""
    for name in ("torch", "cupy"):
        try:
            __import__(name)
            return name
        except ImportError:
            continue
    return None


def _from_cuda_object(obj):
    """A torch tensor or CuPy array over a foreign CUDA array, no copy."""
    lib = default_gpu_lib()
    if lib == "torch":
        import torch
        if hasattr(obj, "__dlpack__"):
            return torch.from_dlpack(obj)
        return torch.as_tensor(obj, device="cuda")
    if lib == "cupy":
        import cupy
        if hasattr(obj, "__cuda_array_interface__"):
            return cupy.asarray(obj)
        return cupy.from_dlpack(obj)
    raise RuntimeError(f"ids of type {type(obj).__name__} are in GPU memory: reading them "
                       "needs torch or CuPy, and neither is installed")


def as_ids(ids):
    """An :class:`Ids` for ``ids``: a CUDA tensor (torch, CuPy, or any object
    with ``__cuda_array_interface__`` / DLPack), a NumPy array or a host
    torch tensor, a list, or a Python int."""
    if is_torch(ids):
        dtype = _np_dtype("torch", ids.dtype)
        _check_id_dtype(dtype, ids.dtype)
        if ids.is_cuda:
            ids = ids.detach().contiguous()
            return Ids(ids, "torch", ids.device.index, dtype, tuple(ids.shape))
        a = ids.detach().numpy()
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        return Ids(a, "torch", None, dtype, a.shape)
    if is_cupy(ids):
        _check_id_dtype(np.dtype(ids.dtype), ids.dtype)
        ids = ids if ids.flags.c_contiguous else ids.copy(order="C")
        return Ids(ids, "cupy", ids.device.id, np.dtype(ids.dtype), tuple(ids.shape))
    if isinstance(ids, np.ndarray):
        a = ids
    elif hasattr(ids, "__cuda_array_interface__"):
        return as_ids(_from_cuda_object(ids))
    elif hasattr(ids, "__dlpack__") and hasattr(ids, "__dlpack_device__"):
        kind = ids.__dlpack_device__()[0]
        if kind in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            return as_ids(_from_cuda_object(ids))
        if kind not in (_KDL_CPU, _KDL_CUDA_HOST):
            raise TypeError(f"ids of type {type(ids).__name__} live on DLPack device type "
                            f"{kind}; fastread takes host or CUDA ids")
        a = np.from_dlpack(ids)
    else:
        if isinstance(ids, (bool, np.bool_)):
            raise TypeError("ids must be int32 or int64, got bool")
        a = np.asarray(ids)
        if a.size == 0 and a.dtype.kind == "f":  # [] is float64 to NumPy
            a = a.astype(np.int64)
    if a.dtype.kind == "i" and a.dtype.byteorder not in "=|" and a.dtype.newbyteorder("=") in ID_DTYPES:
        a = a.astype(a.dtype.newbyteorder("="))
    _check_id_dtype(a.dtype if a.dtype in ID_DTYPES else None, a.dtype)
    a = a if a.flags.c_contiguous else np.ascontiguousarray(a)  # keeps 0-d ids 0-d
    return Ids(a, "numpy", None, a.dtype, a.shape)


def _data_ptr(array, lib):
    if lib == "torch":
        return array.data_ptr()
    if lib == "cupy":
        return array.data.ptr
    return array.ctypes.data


# -- devices ---------------------------------------------------------------------

def parse_device(device, ids):
    """("cpu", None) or ("cuda", index or None) for ``device``: None (where
    the ids are), "cpu", "cuda", "cuda:N", "gpu", a torch.device or an int."""
    if device is None:
        return ("cuda", ids.device) if ids.device is not None else ("cpu", None)
    if isinstance(device, int) and not isinstance(device, bool):
        return ("cuda", device)
    text = str(device)  # torch.device prints as "cuda:0" / "cpu"
    kind, _, index = text.partition(":")
    if kind == "gpu":
        kind = "cuda"
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return (kind, int(index) if index else None)


def torch_dtype(dtype):
    import torch
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except (TypeError, ValueError) as e:
        raise TypeError(f"rows of dtype {dtype} cannot be held by a torch tensor ({e}); "
                        "gather to CuPy ids or to device='cpu'") from None


def check_native(dtype):
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=") != dtype:
        raise TypeError(f"rows of dtype {dtype.str} are not in this machine's byte order: "
                        "GPU outputs need native byte order; gather to device='cpu'")


def stream_handle(stream):
    """A CUstream address from a torch.cuda.Stream, a CuPy stream, or an int."""
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream must be a CUDA stream or its address (>= 0), got {stream}")
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"stream must be a torch.cuda.Stream, a cupy.cuda.Stream or a CUstream "
                    f"address, got {type(stream).__name__}")


def current_stream(lib, device):
    """The current stream of ``lib`` on ``device``, as an address."""
    if lib == "torch":
        import torch
        return torch.cuda.current_stream(device).cuda_stream
    import cupy
    with cupy.cuda.Device(device):
        return cupy.cuda.get_current_stream().ptr


def on_stream(lib, device, stream, handle):
    """A context in which ``lib`` allocates and copies on the stream
    ``handle`` (given as ``stream``), so memory it hands out is safe for
    work queued there."""
    if stream is None:
        return nullcontext()
    if lib == "torch":
        import torch
        if not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))
        return torch.cuda.stream(stream)
    import cupy
    if not isinstance(stream, cupy.cuda.Stream):
        stream = cupy.cuda.ExternalStream(handle, device)
    return stream


def upload(ids, lib, device):
    """Host ids (an Ids of NumPy) on ``device``, as ``lib`` (in the current stream)."""
    if lib == "torch":
        import torch
        return Ids(torch.from_numpy(ids.array).to(torch.device("cuda", device)), "torch", device,
                   ids.dtype, ids.shape)
    import cupy
    with cupy.cuda.Device(device):
        return Ids(cupy.asarray(ids.array), "cupy", device, ids.dtype, ids.shape)


def empty(lib, shape, dtype, device):
    if lib == "torch":
        import torch
        return torch.empty(shape, dtype=torch_dtype(dtype), device=torch.device("cuda", device))
    import cupy
    with cupy.cuda.Device(device):
        return cupy.empty(shape, dtype=dtype)


# -- out= ------------------------------------------------------------------------

def check_host_out(out, shape, dtype):
    """``out`` as a NumPy array fit for host rows of ``shape`` and ``dtype``."""
    if is_torch(out):
        if out.is_cuda:
            raise ValueError(f"out is on {out.device}, but device='cpu' was asked for")
        out_np = out.detach().numpy()
    elif isinstance(out, np.ndarray):
        out_np = out
    else:
        raise TypeError(f"out must be a NumPy array or a torch CPU tensor for device='cpu', "
                        f"got {type(out).__name__}")
    _check_shape_dtype(out_np.shape, out_np.dtype, shape, dtype, str(out_np.dtype))
    if not out_np.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out_np.flags.writeable:
        raise ValueError("out is read-only")
    return out_np


def _check_shape_dtype(got_shape, got_dtype, shape, dtype, got_name):
    if tuple(got_shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(got_shape)}; these ids need {tuple(shape)}")
    if got_dtype != dtype:
        raise TypeError(f"out has dtype {got_name}; the store's rows are {dtype}")


def check_device_out(out, shape, dtype, device):
    """(pointer, lib) of ``out``, a CUDA array fit for rows of ``shape`` and
    ``dtype`` on ``device``."""
    if is_torch(out):
        if not out.is_cuda:
            raise ValueError(f"out is on {out.device}, but device='cuda' was asked for")
        lib, dev, got = "torch", out.device.index, _np_dtype("torch", out.dtype)
        contiguous, got_name = out.is_contiguous(), str(out.dtype)
    elif is_cupy(out):
        lib, dev, got = "cupy", out.device.id, np.dtype(out.dtype)
        contiguous, got_name = out.flags.c_contiguous, str(out.dtype)
    elif hasattr(out, "__cuda_array_interface__"):
        cai = out.__cuda_array_interface__
        lib, dev, got, got_name = "cai", None, np.dtype(cai["typestr"]), cai["typestr"]
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(cai["shape"], got.itemsize)
        if cai["data"][1]:
            raise ValueError("out is read-only (its __cuda_array_interface__ says so)")
        _check_shape_dtype(cai["shape"], got, shape, dtype, got_name)
        if not contiguous:
            raise ValueError("out must be C-contiguous")
        return cai["data"][0], lib
    else:
        raise TypeError(f"out must be a CUDA tensor (torch, CuPy or __cuda_array_interface__) "
                        f"for device='cuda', got {type(out).__name__}")
    _check_shape_dtype(out.shape, got, shape, dtype, got_name)
    if not contiguous:
        raise ValueError("out must be C-contiguous")
    if device is not None and dev != device:
        raise ValueError(f"out is on GPU {dev}; the rows are gathered on GPU {device}")
    return _data_ptr(out, lib), lib


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def first_bad(ids, rows):
    """(position, id) of the first id outside [0, rows) in ``ids`` (any
    library), flattened order; None if every id is in range."""
    a = ids.array.reshape(-1)
    bad = (a < 0) | (a >= rows)
    if ids.lib == "torch":
        pos = bad.nonzero()
        if len(pos) == 0:
            return None
        p = int(pos[0, 0])
        return p, int(a[p])
    if ids.lib == "cupy":
        import cupy
        pos = cupy.flatnonzero(bad)
        if len(pos) == 0:
            return None
        p = int(pos[0])
        return p, int(a[p])
    pos = np.flatnonzero(bad)
    return (int(pos[0]), int(a[pos[0]])) if len(pos) else None
