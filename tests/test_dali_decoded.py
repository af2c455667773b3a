"""``readers.image(decoded=True)`` (issue 33) on CPU-only DALI: each sample
is its stored uint8 HWC array, through the native operator and the external
source alike, for one shape (``--crop``: one block per batch) and several;
followed by DALI's augmentation without a decoder; images that are not raw
pixels refused saying why."""
import os

import numpy as np
import pytest

from dali_helpers import make_gpu_pipe, make_pipe, needs_gpu
from nvidia.dali import fn, types  # noqa: E402 (dali_helpers skips without DALI)

import fastread  # noqa: E402
from fastread.dali import readers  # noqa: E402
from fastread.datasets import make_imagenet_like  # noqa: E402


@pytest.fixture(scope="module")
def packs(disk_tmp):
    root = os.path.join(disk_tmp, "dali_decoded_tree")
    make_imagenet_like(root, classes=3, per_class=6, width=80, height=60, mean_kb=3,
                       workers=1, progress=False)
    crop = fastread.pack(root, os.path.join(disk_tmp, "dd_crop.img"), decode=True, resize=24,
                         crop=20, decode_workers=0, progress=False)
    var = fastread.pack(root, os.path.join(disk_tmp, "dd_var.img"), decode=True, resize=24,
                        decode_workers=0, progress=False)
    jpeg = fastread.pack(root, os.path.join(disk_tmp, "dd_jpeg.img"), decode=True,
                         max_side=64, encode="jpeg", decode_workers=0, progress=False)
    plain = fastread.pack(root, os.path.join(disk_tmp, "dd_plain.img"), progress=False)
    # Binary indexes (version 3): the operator maps them and reads the
    # shapes column itself (image_index=), no npy_* list per sample.
    crop_bin = fastread.pack(root, os.path.join(disk_tmp, "dd_crop_bin.img"), decode=True,
                             resize=24, crop=20, decode_workers=0, progress=False,
                             index_format="binary")
    var_bin = fastread.pack(root, os.path.join(disk_tmp, "dd_var_bin.img"), decode=True,
                            resize=24, decode_workers=0, progress=False, index_format="binary")
    return dict(crop=crop, var=var, jpeg=jpeg, plain=plain, crop_bin=crop_bin, var_bin=var_bin)


def expected(img):
    return [img.pixels(a, i) for i, a in enumerate(img.read(np.arange(len(img))))]


def run(pipe, iterations):
    out = []
    for _ in range(iterations):
        data, labels = pipe.run()
        out.append(([np.array(data[i]) for i in range(len(data))],
                    [int(np.array(labels[i])[0]) for i in range(len(labels))],
                    data.layout()))
    return out


@pytest.mark.parametrize("which", ["crop", "var", "crop_bin", "var_bin"])
@pytest.mark.parametrize("native", [True, False], ids=["operator", "external"])
@pytest.mark.parametrize("kw", [dict(), dict(o_direct=True), dict(num_shards=2, shard_id=1, stick_to_shard=True)],
                         ids=["plain", "o_direct", "shard"])
def test_outputs_equal_the_stored_arrays(packs, which, native, kw):
    img = packs[which]
    want = expected(img)
    shard = range(len(img)) if "num_shards" not in kw else range(9, 18)
    p = make_pipe(lambda: readers.image(image=img.path, decoded=True, native=native,
                                        name="R", **kw), 4)
    assert bool(getattr(p, "_fastread_readers", [])) is not native
    got = run(p, 6)
    # Rolling epochs: the shard's samples round and round.
    flat = [a for data, _, _ in got for a in data]
    labels = [x for _, lab, _ in got for x in lab]
    order = [shard[i % len(shard)] for i in range(len(flat))]
    for a, i in zip(flat, order):
        assert a.dtype == np.uint8 and a.shape == want[i].shape
        np.testing.assert_array_equal(a, want[i])
    assert labels == [int(img.labels[i]) for i in order]
    assert got[0][2] == "HWC"   # for DALI's image operators, from the operator too


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=needs_gpu)])
def test_followed_by_dali_augmentation_without_a_decoder(packs, device):
    """DALI's random_resized_crop and crop_mirror_normalize right after the
    reader, no decoder; on the GPU (device="gpu": the operator, which writes
    the pixels to the GPU itself, issue 39) with no host step between."""
    img = packs["crop"]

    def graph():
        images, labels = readers.image(image=img.path, decoded=True, random_shuffle=True,
                                       seed=1, name="R", device=device)
        images = fn.random_resized_crop(images, size=(16, 16), seed=2)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
                                          mirror=fn.random.coin_flip(seed=3))
        return images, labels

    p = (make_gpu_pipe if device == "gpu" else make_pipe)(graph, 8)
    assert not getattr(p, "_fastread_readers", [])   # the operator, not the external source
    for _ in range(3):
        images, labels = p.run()
        if device == "gpu":
            images = images.as_cpu()
        arr = np.array(images.as_tensor())
        assert arr.shape == (8, 3, 16, 16) and arr.dtype == np.float32
        assert np.isfinite(arr).all() and arr.std() > 0.1


@pytest.mark.parametrize("which", ["crop_bin", "var_bin"])
def test_binary_index_passes_no_list_per_sample(packs, which):
    img = packs[which]
    assert img.version == 3 and "shapes" in img.mapped_layout["columns"]
    p = make_pipe(lambda: readers.image(image=img.path, decoded=True, native=True), 4)
    got = p.serialize()
    assert b"image_index" in got and b"npy_shapes" not in got and b"range_offsets" not in got


def test_damaged_shape_in_a_mapped_index_fails_naming_the_sample(packs, tmp_path):
    # The mapped shapes are not walked at open (10^8 samples): a damaged one
    # fails the batch that meets it, naming the sample, never a wrong view.
    import shutil
    from fastread.dali._native import index_args
    from fastread.image import PackedImage
    img = packs["var_bin"]
    out = str(tmp_path / "copy.img")
    shutil.copyfile(img.path, out)
    shutil.copyfile(img.index_path, out + ".index")
    mine = PackedImage(out)
    args = index_args(mine.mapped_layout, shapes=True)
    with open(out + ".index", "r+b") as f:   # sample 1's height: -5 (size and header kept)
        f.seek(mine.mapped_layout["columns"]["shapes"][0] + 3 * 8)
        f.write(np.array([-5], "<i8").tobytes())
    p = make_pipe(lambda: fn.fastread.readers.file(image=out, npy_ndim=3,
                                                   npy_dtype=types.UINT8, **args), 4)
    name = list(mine.names)[1]
    with pytest.raises(RuntimeError, match=rf"copy\.img\[{name}\] is \d+ bytes, its shape in "
                                           r"the index needs no valid size"):
        p.run()


def test_native_dense_batch_is_one_block(packs):
    """Decoded samples of one shape: the operator hands DALI a batch as one
    block of the reader's arena (samples back to back), not per-sample
    copies."""
    img = packs["crop"]
    p = make_pipe(lambda: readers.image(image=img.path, decoded=True, native=True), 5)
    for _ in range(5):
        data, _ = p.run()
        ptrs = [data[i].data_ptr() for i in range(len(data))]
        assert all(ptrs[i] + 20 * 20 * 3 == ptrs[i + 1] for i in range(len(data) - 1))


@pytest.mark.parametrize("which, match", [("plain", "the source files' bytes"),
                                          ("jpeg", "decode them with fn.decoders.image")])
def test_images_that_are_not_pixels_are_refused(packs, which, match):
    img = packs[which]
    with pytest.raises(ValueError, match=match):
        make_pipe(lambda: readers.image(image=img.path, decoded=True), 4)


def _schema(node):
    """The DALI operator (schema name) that produced a DataNode."""
    return node.source._op.schema_name


@pytest.mark.parametrize("native", [None, True])
def test_gpu_output_is_the_operators(packs, native):
    """device="gpu" (defined here, built on a GPU only): the native
    operator's GPU outputs, the pixels relabelled HWC (issue 39: decoded
    samples took the external source, and DALI's .gpu(), for GPU output)."""
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline(batch_size=4, num_threads=1, device_id=0)
    with pipe:
        data, labels = readers.image(image=packs["var"].path, decoded=True, device="gpu",
                                     native=native)
    assert data.device == "gpu" and labels.device == "gpu"
    assert _schema(data) == "Reshape"
    assert _schema(data.source.inputs[0]) == _schema(labels) == "fastread__readers__File"
    # DALI's mixed operator: its copies on the mixed stream, beside the GPU
    # operators that follow (fastread.dali._image.GPU_OUTPUT_STAGE).
    assert labels.source._op.device == "mixed"
    assert not getattr(pipe, "_fastread_readers", [])


@needs_gpu
@pytest.mark.parametrize("which", ["crop", "var"])
@pytest.mark.parametrize("native", [True, False], ids=["operator", "external"])
def test_gpu_output_equals_the_stored_arrays(packs, which, native):
    """device="gpu": each sample its HWC array in GPU memory, written there
    by the native operator (issue 39) or by the external source's reader;
    labels on the GPU too."""
    img = packs[which]
    want = expected(img)
    p = make_gpu_pipe(lambda: readers.image(image=img.path, decoded=True, device="gpu",
                                            native=native, name="R"), 4)
    assert bool(getattr(p, "_fastread_readers", [])) is not native
    flat, labels = [], []
    for _ in range(5):
        data, lab = p.run()
        assert type(data).__name__ == "TensorListGPU" and data.layout() == "HWC"
        assert type(lab).__name__ == "TensorListGPU"
        data, lab = data.as_cpu(), lab.as_cpu()
        flat += [np.array(data[i]) for i in range(len(data))]
        labels += [int(np.array(lab[i]).reshape(-1)[0]) for i in range(len(lab))]
    for k, a in enumerate(flat):
        np.testing.assert_array_equal(a, want[k % len(img)])
    assert labels == [int(img.labels[k % len(img)]) for k in range(len(flat))]
