"""``fastread.dali.readers.numpy``: the counterpart of DALI's
``fn.readers.numpy`` for datasets of ``.npy`` files, with CPU or GPU output.

The same files in the same order (files directly in ``file_root`` and in its
subdirectories, matching ``file_filter``; or ``files`` / ``file_list``), the
same arrays (Fortran-ordered files come out C-ordered, as DALI gives them),
the same sharding, shuffling and epochs as :func:`fastread.dali.readers.file`.

Every header is read once, when the pipeline is defined
(:class:`fastread.npy.NpyIndex`); a batch is then whole files read by the
native engine, and each sample is a view of its data part: no copy on the
CPU, and on the GPU none after the batch's one upload (or none at all with
``engine="cufile"``, which reads into GPU memory like DALI's GDS reader).

Where the native DALI operator serves the call (``native=None``: the plugin
loads, the files share one dtype and rank, none is Fortran-ordered or of
foreign byte order, epochs roll), the arrays' layout goes to it as arguments
and no Python runs per batch: on the CPU each sample is a view into the
reader's arena, on the GPU one copy per sample from page-locked memory.
Otherwise an external source, as before.
"""
import numpy as np

from fastread.dali._common import check_epoch_end, reader_outputs
from fastread.dali.sources import BatchSource, gpu_batch
from fastread.dali._native import native_reader, use_native
from fastread.index import scan, scan_numpy
from fastread.npy import NpyError, NpyIndex
from fastread.reader import check_device
from fastread.source import FileList

# fn.readers.numpy arguments that cut regions out of arrays: not done here.
_ROI_ARGS = {"roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape",
             "rel_roi_shape", "roi_axes", "out_of_bounds_policy", "fill_value"}


class _NumpySource(BatchSource):
    """Turns a batch of whole .npy files into the arrays they hold. The
    reader's labels are the samples' indices (see numpy())."""

    def __init__(self, reader, index, gpu):
        super().__init__(reader)
        self.index = index
        self.gpu = gpu
        self.device_id = reader.device_id
        if gpu:
            import cupy
            self._cupy = cupy
        # Per-sample facts as plain lists: cheaper to index than arrays.
        self._offset = index.data_offset.tolist()
        self._size = index.file_size.tolist()
        self._fortran = index.fortran_order.tolist()
        self._typestr = [d.str for d in index.dtype]
        self._itemsize = [d.itemsize for d in index.dtype]

    def __next__(self):
        arrays, ids = super().__next__()
        out = []
        for a, i in zip(arrays, ids.ravel().tolist()):
            if len(a) != self._size[i]:
                raise NpyError(self.index.paths[i],
                               f"{len(a)} bytes now, {self._size[i]} when its header was read: "
                               "the file changed")
            shape = self.index.shape[i]
            if self._fortran[i]:
                out.append(self._fortran_to_c(a, i, shape))
            elif self.gpu:
                out.append(a.view(self._offset[i], shape, self._typestr[i], self._itemsize[i]))
            else:
                off = self._offset[i]
                out.append(a[off:].view(self.index.dtype[i]).reshape(shape))
        return (gpu_batch(out, self.device_id) if self.gpu else out,)

    def _fortran_to_c(self, a, i, shape):
        rev = tuple(reversed(shape))
        if self.gpu:
            v = a.view(self._offset[i], rev, self._typestr[i], self._itemsize[i])
            return self._cupy.ascontiguousarray(self._cupy.asarray(v).T)
        off = self._offset[i]
        return np.ascontiguousarray(a[off:].view(self.index.dtype[i]).reshape(rev).T)


def numpy(*, file_root=None, file_filter="*.npy", files=None, file_list=None, shard_id=0,
          num_shards=1, random_shuffle=False, shuffle_after_epoch=False, seed=-1,
          pad_last_batch=False, stick_to_shard=False, prefetch_queue_depth=1, name=None,
          last_batch_policy=None, case_sensitive_filter=False, engine="auto", device="cpu",
          device_id=None, use_o_direct=None, epoch_end="roll", native=None, **kwargs):
    """``fn.readers.numpy`` read by fastread; returns the arrays' DataNode.

    ``device="gpu"`` delivers them in GPU memory (see readers.file);
    ``engine="cufile"`` reads the files straight into it (GPUDirect Storage,
    or cuFile's compatibility mode). ``use_o_direct`` maps to the engines'
    ``o_direct``. Region-of-interest arguments (``roi_*``) are not supported:
    slice after the reader. Extra keyword arguments are engine and Reader
    options, as for readers.file; ``epoch_end`` and ``name`` too (rolling
    epochs by default, ``reader_name=name`` for the DALI iterators). Always
    ``native``: None (the native operator where it serves the call, else an
    external source), True (the operator, or ValueError / RuntimeError
    saying why not), False (the external source). Headers are parsed in
    Python, once, either way.
    """
    check_epoch_end(epoch_end)
    device = check_device(device)
    roi = sorted(_ROI_ARGS & set(kwargs))
    if roi:
        raise TypeError(f"fastread.dali.readers.numpy does not take {', '.join(roi)}: "
                        "read whole arrays and slice them in the pipeline (fn.slice)")
    kwargs.pop("cache_header_information", None)  # headers are always cached
    if use_o_direct is not None:
        kwargs["o_direct"] = bool(use_o_direct)
    if files is not None or file_list is not None:
        paths, _ = scan(file_root, file_list=file_list, files=files)
    else:
        if file_root is None:
            raise ValueError("fastread.dali.readers.numpy needs file_root, files or file_list")
        paths = scan_numpy(file_root, file_filter, case_sensitive_filter=case_sensitive_filter)
        if not paths:
            raise ValueError(f"no files matching {file_filter!r} in file_root {file_root!r} "
                             "or its subdirectories")
    index = NpyIndex.build(paths)
    if use_native("fastread.dali.readers.numpy", native, epoch_end, device, device_id, None,
                  engine, kwargs, extra_obstacle=lambda: _layout_obstacle(index)):
        data, _labels = native_reader(
            FileList(paths, np.arange(len(paths))), shard_id=shard_id, num_shards=num_shards,
            random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
            pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
            prefetch_queue_depth=prefetch_queue_depth, name=name, engine=engine, device=device,
            device_id=device_id, kwargs=kwargs, what="fastread.dali.readers.numpy",
            layout_args=_layout_args(index))
        return data
    return reader_outputs(
        "numpy", lambda: FileList(paths, np.arange(len(paths))), shard_id=shard_id,
        num_shards=num_shards, random_shuffle=random_shuffle or shuffle_after_epoch, seed=seed,
        pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
        prefetch_queue_depth=prefetch_queue_depth, name=name,
        last_batch_policy=last_batch_policy, engine=engine, device=device, no_copy=True,
        device_id=device_id, kwargs=kwargs,
        make_batch_source=lambda reader, gpu: _NumpySource(reader, index, gpu), num_outputs=1,
        epoch_end=epoch_end)


def _layout_obstacle(index):
    """Why the operator cannot give these files' arrays (None if it can):
    it outputs C-ordered arrays of one dtype and rank, as they lie."""
    dtypes = {d.str for d in index.dtype}
    if len(dtypes) > 1:
        return f"the files hold arrays of {len(dtypes)} dtypes ({', '.join(sorted(dtypes))})"
    ranks = {len(s) for s in index.shape}
    if len(ranks) > 1:
        return f"the files hold arrays of {len(ranks)} ranks ({', '.join(map(str, sorted(ranks)))})"
    dtype = index.dtype[0]
    if not dtype.isnative and dtype.itemsize > 1:
        return f"'{index.paths[0]}': dtype {dtype.str} is not in this machine's byte order"
    try:
        from nvidia.dali import types
        types.to_dali_type(dtype)
    except Exception:  # DALI has no such type (e.g. complex, strings)
        return f"'{index.paths[0]}': DALI has no type for dtype {dtype.str}"
    fortran = np.flatnonzero(index.fortran_order)
    if len(fortran):
        return (f"'{index.paths[fortran[0]]}' is Fortran-ordered (the external source "
                "transposes it)")
    return None


def _layout_args(index):
    from nvidia.dali import types
    return dict(npy_ndim=len(index.shape[0]), npy_dtype=types.to_dali_type(index.dtype[0]),
                npy_data_offsets=index.data_offset.tolist(),
                npy_shapes=[int(x) for shape in index.shape for x in shape])
