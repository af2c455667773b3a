"""What DALI pulls a fastread reader's batches from: a batch
``fn.external_source`` over a :class:`fastread.Reader` (:class:`BatchSource`;
:class:`GpuBatchSource` for batches already in GPU memory), with DALI's
rolling epochs or StopIteration at each epoch's end.

Public, for pipelines of one's own (:class:`fastread.torch.ImageLoader`
builds one); the fastread DALI readers build theirs through it. Imports no
DALI until a GPU batch is made.
"""
import numpy as np

__all__ = ["BatchSource", "GpuBatchSource", "gpu_batch"]


class BatchSource:
    """What DALI pulls batches from. DALI calls iter() on a non-cycling
    source once and keeps calling next() after each reset, so the first
    next() after an epoch's StopIteration starts the next epoch.

    With ``roll`` set, epochs never end, as in DALI's own readers: the shard
    is one stream of samples, and a batch that crosses an epoch's end is
    filled from the next epoch (with ``pad_last_batch`` every epoch is whole
    batches, so none does). Subclasses that transform batches call
    ``super().__next__()`` and get the stream either way."""

    roll = False

    def __init__(self, reader):
        self.reader = reader
        self._it = None
        self._carry = None  # roll: samples of a split batch not handed out yet

    def __iter__(self):
        return self

    def _epoch_batch(self):
        if self._it is None:
            self._it = iter(self.reader)
        try:
            return next(self._it)
        except StopIteration:
            self._it = None
            raise

    def __next__(self):
        if not self.roll:
            arrays, labels = self._epoch_batch()
            return arrays, labels.reshape(-1, 1)
        size = self.reader.batch_size
        arrays, labels = self._carry or ([], [])
        self._carry = None
        ends = 0
        while len(arrays) < size:
            try:
                more, more_labels = self._epoch_batch()
            except StopIteration:
                ends += 1
                if ends > 1:  # cannot happen: every shard holds a sample
                    raise RuntimeError("fastread reader: an epoch without samples") from None
                continue
            ends = 0
            if not arrays and len(more) == size:
                return more, more_labels.reshape(-1, 1)  # the usual case: no splicing
            arrays = arrays + list(more)
            labels = labels + [more_labels]
        labels = np.concatenate(labels)
        if len(arrays) > size:
            self._carry = (arrays[size:], [labels[size:]])
        return arrays[:size], labels[:size].reshape(-1, 1)


def gpu_batch(arrays, device_id):
    """The batch as one DALI TensorListGPU over the samples' device memory
    (no copy). Handing DALI a TensorList skips its per-sample Python checks
    (measured on an H200: those cost about 5 us a sample, more than the
    native read and upload of the whole batch). Through DLPack, DALI later
    frees each sample with a native deleter; through the CUDA array
    interface each free would take the GIL from DALI's thread."""
    from nvidia.dali.tensors import TensorGPU, TensorListGPU
    if hasattr(TensorListGPU, "from_dlpack_list"):
        return TensorListGPU.from_dlpack_list(arrays, "", contiguous=False)
    return TensorListGPU([TensorGPU(a, "", device_id) for a in arrays], "", contiguous=False)


class GpuBatchSource(BatchSource):
    """Batches already in GPU memory: the reader's native workers copied each
    batch's contiguous pinned arena to a device buffer in one copy (or the
    cufile engine read it there) and finished before handing it over, so DALI
    gets the samples with nothing left to wait for. Labels go up with one
    small copy per batch on a private non-blocking stream, which DALI is
    told to order its work after (the external source's ``cuda_stream``);
    on CuPy's default stream that copy would serialise with the device's
    other work."""

    def __init__(self, reader, device_id):
        super().__init__(reader)
        import cupy

        self._cupy = cupy
        self._device = cupy.cuda.Device(device_id)
        self._device_id = device_id
        with self._device:
            self.cuda_stream = cupy.cuda.Stream(non_blocking=True)

    def __next__(self):
        arrays, labels = super().__next__()
        with self._device, self.cuda_stream:
            return gpu_batch(arrays, self._device_id), self._cupy.asarray(labels)
