"""Modes over record formats (:mod:`fastread.formats`). DATA is a CIFAR-10
directory (``fastread make-dataset DIR --format cifar10``, or the real
archive unpacked: ``cifar-10-batches-bin`` / ``cifar-10-batches-py``).

Every CIFAR mode delivers a training batch: the train images in a new
random order each epoch, a random 32x32 crop of the image padded by 4
pixels, a random horizontal flip, normalization to float32 NCHW, on the
bench's device (``--device gpu``: in GPU memory). Bytes count the float32
output.

===========================  ================================================
``cifar-torchvision``        ``torchvision.datasets.CIFAR10`` with
                             RandomCrop/RandomHorizontalFlip/ToTensor/
                             Normalize + ``DataLoader(num_workers=cores)``:
                             the baseline
``cifar-torch-python``       the same per-sample work without torchvision
                             (NumPy per image in a ``Dataset``,
                             ``DataLoader(num_workers=cores)``)
``cifar-dali-numpy``         DALI fed from the images in NumPy arrays in
                             memory (``fn.external_source`` of shuffled
                             batches), then ``fn.slice`` (crop) +
                             ``fn.crop_mirror_normalize``: the DALI baseline
``cifar-fastread-<e>``       ``fastread.dali.formats.cifar10(engine=<e>)``
                             (the images read once with engine <e> and held
                             in memory, one gather per batch), the same DALI
                             augmentation
``cifar-fastread-ranges``    ``cifar10(in_memory=False)``: every batch read
                             as byte ranges of the batch files
``cifar-fastread-torch``     ``fastread.torch.Cifar10Loader
                             (augment=True)``: the records read once
                             (natively) into a tensor on the device, each
                             batch a gather and the augmentation on whole
                             batches in torch, on the GPU with --device gpu
``cifar-fastread-torch-ranges``  the same with ``in_memory=False``: every
                             batch read as byte ranges, then copied
===========================  ================================================

DATA may also be a directory of WebDataset shards (``*.tar``, ``*.tar.gz``;
``fastread make-dataset DIR --format webdataset``). Each step is a batch
of (jpg, cls) samples; with ``--decode`` the JPEGs are decoded (DALI's
decoder, ``mixed`` on the GPU; PIL in the webdataset library's loader).

===========================  ================================================
``wds-library``              the webdataset library's ``WebDataset`` (+
                             ``.decode("rgb8")`` with ``--decode``) in a
                             ``DataLoader(num_workers=cores)``: the baseline
``wds-dali``                 DALI's ``fn.readers.webdataset``: the DALI
                             baseline
``wds-fastread-<e>``         ``fastread.dali.formats.webdataset(engine=<e>)``:
                             the native operator where the plugin loads
``wds-extsrc-<e>``           the same through ``fn.external_source``
                             (``native=False``)
===========================  ================================================

DATA may also be a squirrel MessagePack store (a directory of ``*.gz``
shards; ``fastread make-dataset DIR --format squirrel``); each step is a
batch of (image, label), on the GPU with ``--device gpu``.

===========================  ================================================
``squirrel-iter``            squirrel-core's ``MessagepackDriver(url)
                             .get_iter()`` feeding DALI through
                             ``fn.external_source`` (the Squirrel + DALI
                             tutorial's pipeline): the baseline
``squirrel-fastread-<e>``    ``fastread.dali.formats.squirrel(engine=<e>)``
===========================  ================================================
"""
import os

import numpy as np

from fastread.bench.registry import Dataset, Mode, add_dataset_kind, default_engine

NAME = "formats"
ORDER = 60
BOTH = ("cpu", "gpu")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

add_dataset_kind("cifar10", "a CIFAR-10 directory (binary or Python batches)")
add_dataset_kind("webdataset", "a directory of WebDataset tar shards")
add_dataset_kind("squirrel", "a squirrel MessagePack store (a directory of *.gz shards)")
WDS_EXT = ["jpg;jpeg;png", "cls"]


def shard_paths(path):
    """The WebDataset shards directly in directory ``path``, sorted."""
    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if n.endswith((".tar", ".tar.gz", ".tgz")))


def detect(path):
    """A directory holding the CIFAR-10 train batches (either layout; checked
    first: the downloaded ``cifar-10-python.tar.gz`` may lie beside them), a
    squirrel store, or WebDataset shards."""
    if not os.path.isdir(path):
        return None
    from fastread.bench.registry import BenchError
    from fastread.formats import FormatError
    from fastread.formats.cifar import Cifar10, cifar10_files
    try:
        _layout, paths = cifar10_files(path, train=True)
    except FileNotFoundError:
        paths = None
    if paths:
        try:
            n = len(Cifar10(path, train=True))
        except FormatError as e:
            raise BenchError(str(e)) from None
        return Dataset(root=path, primary="cifar10", kinds=("cifar10",), paths=paths, samples=n,
                       nbytes=n * 3072)
    sq = _squirrel_shards(path)
    if sq:
        from fastread.formats.squirrel import SquirrelStore
        try:
            src = SquirrelStore(path, keys=("image", "label"))
        except FormatError as e:
            raise BenchError(str(e)) from None
        return Dataset(root=path, primary="squirrel", kinds=("squirrel",), paths=sq,
                       samples=len(src), nbytes=int(src.sizes.sum()))
    shards = shard_paths(path)
    if shards:
        from fastread.formats.webdataset import WebDataset
        try:
            src = WebDataset(shards, WDS_EXT)
        except FormatError as e:
            raise BenchError(str(e)) from None
        return Dataset(root=path, primary="webdataset", kinds=("webdataset",), paths=shards,
                       samples=len(src), nbytes=int(src.sizes.sum()))
    return None


def modes(env):
    auto = default_engine(env)
    yield Mode("cifar-torchvision", NAME, "cifar10",
               "torchvision CIFAR10 + transforms + DataLoader(num_workers=cores)",
               "torchvision's CIFAR10 with per-sample transforms in DataLoader workers: "
               "the baseline", check=_check_torch, build=_build_torch, role="baseline",
               default=BOTH, params=(("torchvision", True),))
    yield Mode("cifar-torch-python", NAME, "cifar10",
               "per-sample NumPy crop/flip/normalize + DataLoader(num_workers=cores)",
               "the same per-sample work without torchvision", check=_check_torch,
               build=_build_torch, role="python", default=BOTH)
    yield Mode("cifar-dali-numpy", NAME, "cifar10",
               "fn.external_source(NumPy arrays in memory) + DALI crop/flip/normalize",
               "DALI fed from NumPy arrays in memory: the DALI baseline", check=_check_dali,
               build=_build_dali_numpy, role="baseline", dali=True, default=BOTH)
    for e in env.engines:
        yield Mode(f"cifar-fastread-{e}", NAME, "cifar10",
                   f"fastread.dali.formats.cifar10(engine={e!r}) + DALI crop/flip/normalize",
                   "fastread's CIFAR-10 reader (loaded once, held in memory) in the same DALI "
                   "pipeline",
                   engine=e, check=_check_dali, build=_build_dali_fastread, dali=True,
                   default=BOTH if e == auto else ())
    yield Mode("cifar-fastread-ranges", NAME, "cifar10",
               f"fastread.dali.formats.cifar10(engine={auto!r}, in_memory=False) + DALI "
               "crop/flip/normalize",
               "fastread's CIFAR-10 reader reading every batch as byte ranges",
               engine=auto, check=_check_dali, build=_build_dali_fastread, dali=True,
               params=(("in_memory", False),))
    yield Mode("cifar-fastread-torch", NAME, "cifar10", "Cifar10Loader(augment=True)",
               "fastread's CIFAR-10 torch loader: records in memory on the device, batched "
               "torch augmentation there",
               engine=auto, check=_check_torch, build=_build_fastread_torch, default=BOTH)
    yield Mode("cifar-fastread-torch-ranges", NAME, "cifar10",
               "Cifar10Loader(augment=True, in_memory=False)",
               "fastread's CIFAR-10 torch loader reading every batch as byte ranges",
               engine=auto, check=_check_torch, build=_build_fastread_torch,
               params=(("in_memory", False),))
    yield Mode("squirrel-iter", NAME, "squirrel",
               "MessagepackDriver(url).get_iter() -> fn.external_source",
               "squirrel-core's iterator feeding DALI (the tutorial's pipeline): the baseline",
               check=_check_squirrel, build=_build_squirrel, role="baseline", dali=True,
               default=BOTH)
    for e in env.engines:
        yield Mode(f"squirrel-fastread-{e}", NAME, "squirrel",
                   f"fastread.dali.formats.squirrel(engine={e!r})",
                   "fastread's squirrel reader (one range read per sample, arrays as views)",
                   engine=e, check=_check_squirrel, build=_build_squirrel, dali=True,
                   default=BOTH if e == auto else ())
    yield Mode("wds-library", NAME, "webdataset",
               "webdataset.WebDataset (+ .decode('rgb8')) + DataLoader(num_workers=cores)",
               "the webdataset library's loader: the baseline", check=_check_wds_library,
               build=_build_wds_library, role="baseline", default=BOTH)
    yield Mode("wds-dali", NAME, "webdataset", "fn.readers.webdataset",
               "DALI's own WebDataset reader: the DALI baseline", check=_check_wds_dali,
               build=_build_wds_dali, role="baseline", dali=True, default=BOTH)
    for e in env.engines:
        yield Mode(f"wds-fastread-{e}", NAME, "webdataset",
                   f"fastread.dali.formats.webdataset(engine={e!r})",
                   "fastread's WebDataset reader in DALI: the native operator where the "
                   "plugin loads (one range read per component), else the external source",
                   engine=e, check=_check_wds_dali, build=_build_wds_dali, dali=True,
                   default=BOTH if e == auto else ())
    yield Mode(f"wds-extsrc-{auto}", NAME, "webdataset",
               f"fastread.dali.formats.webdataset(engine={auto!r}, native=False)",
               "fastread's WebDataset reader through fn.external_source (components "
               "packed per batch, cut by fn.slice)",
               engine=auto, check=_check_wds_dali, build=_build_wds_dali, dali=True,
               params=(("native", False),))


# -- checks ------------------------------------------------------------------------

def _check_device(cfg):
    if cfg.decode:
        return "CIFAR images are raw arrays; drop --decode"
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_torch(mode, cfg):
    from fastread.bench.environment import try_import
    _torch, why = try_import("torch")
    if why:
        return f"torch {why}"
    if mode.param("torchvision"):
        _tv, why = try_import("torchvision.datasets")
        if why:
            return f"torchvision {why}"
    if mode.engine is not None:
        why = cfg.env.engine_error(mode.engine)
        if why:
            return why
    return _check_device(cfg)


def _check_dali(mode, cfg):
    if mode.engine is not None:
        why = cfg.env.engine_error(mode.engine)
        if why:
            return why
    return cfg.env.dali_error_for(fastread_reader=mode.engine is not None) or _check_device(cfg)


# -- DALI ----------------------------------------------------------------------------

def dali_augment(images, gpu):
    """The CIFAR training transform in DALI: random crop of the 4-pixel
    zero-padded image, random flip, normalize to float32 CHW."""
    from nvidia.dali import fn, types

    images = fn.reshape(images, layout="HWC")
    if gpu:
        images = images.gpu()
    anchor = fn.cast(fn.random.uniform(values=[float(v) for v in range(-4, 5)], shape=2),
                     dtype=types.INT32)
    images = fn.slice(images, anchor, np.array([32, 32], np.int32), axes=(0, 1),
                      out_of_bounds_policy="pad", fill_values=0)
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                    mirror=fn.random.coin_flip(),
                                    mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])


class _NumpyEpochs:
    """Shuffled batches of in-memory arrays, an epoch at a time (StopIteration
    at its end, as DALI's non-cycling external sources expect)."""

    def __init__(self, images, labels, batch_size, seed=0):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.rng = np.random.default_rng(seed)
        self._order, self._pos = self.rng.permutation(len(images)), 0

    def __iter__(self):
        return self

    def __next__(self):
        if self._pos >= len(self._order):
            self._order, self._pos = self.rng.permutation(len(self.images)), 0
            raise StopIteration
        idx = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.images[idx], self.labels[idx].reshape(-1, 1)


def load_in_memory(root):
    """The train images (N, 32, 32, 3) uint8 HWC and int32 labels, in memory."""
    from fastread.formats.cifar import Cifar10, to_hwc
    src = Cifar10(root, train=True)
    return to_hwc(src.read(np.arange(len(src)))), src.labels.copy()


def _build_dali_numpy(mode, cfg):
    from fastread.bench.runners import DaliRunner
    images, labels = load_in_memory(cfg.data_dir)

    def outputs():
        from nvidia.dali import fn
        data, lab = fn.external_source(
            source=_NumpyEpochs(images, labels, cfg.batch_size), num_outputs=2, batch=True,
            cycle=False)
        return dali_augment(data, cfg.device == "gpu"), lab
    return DaliRunner(cfg, None, outputs=outputs)


def _build_dali_fastread(mode, cfg):
    from fastread.bench.runners import DaliRunner

    def outputs():
        from fastread.dali.formats import cifar10
        data, lab = cifar10(file_root=cfg.data_dir, train=True, random_shuffle=True,
                            engine=mode.engine, in_memory=mode.param("in_memory", True),
                            **cfg.engine_options)
        return dali_augment(data, cfg.device == "gpu"), lab
    return DaliRunner(cfg, None, outputs=outputs)


# -- torch ---------------------------------------------------------------------------

class _TorchRunner:
    """Batches of an iterable of (images, labels) torch tensors, epoch after
    epoch; a GPU batch is waited for (as the next training step would)."""

    def __init__(self, loader, gpu):
        self.loader, self.gpu = loader, gpu
        self._it, self._keep = iter(loader), None

    def next(self):
        try:
            images, labels = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            images, labels = next(self._it)
        if self.gpu:
            import torch
            torch.cuda.current_stream().synchronize()
        self._keep = images
        return len(images), images.numel() * images.element_size()

    def close(self):
        self._keep = self._it = None
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()


class _PerSample:
    """What a per-sample Dataset does for each image (torchvision's transforms,
    re-done in NumPy): pad + random crop, random flip, to CHW float, normalize."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels
        self.mean = np.array(MEAN, np.float32)[:, None, None] * 255
        self.std = np.array(STD, np.float32)[:, None, None] * 255

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        import torch
        img = np.pad(self.images[i], ((4, 4), (4, 4), (0, 0)))
        y, x = np.random.randint(0, 9, 2)
        img = img[y:y + 32, x:x + 32]
        if np.random.rand() < 0.5:
            img = img[:, ::-1]
        chw = (img.transpose(2, 0, 1).astype(np.float32) - self.mean) / self.std
        return torch.from_numpy(chw), int(self.labels[i])


def torchvision_cifar10(root, train=True, transform=None):
    """torchvision.datasets.CIFAR10 over a CIFAR-10 directory (root, or its
    cifar-10-batches-py), without the MD5 checks: torchvision compares the
    batch files (_check_integrity) and batches.meta (_load_meta, through
    meta["md5"]) with the real archive's sums, which a synthetic set made by
    make-dataset cannot match. Files must still exist and unpickle."""
    from torchvision.datasets import CIFAR10

    root = os.path.normpath(os.fspath(root))
    if os.path.basename(root) == "cifar-10-batches-py":
        root = os.path.dirname(root)

    class _Cifar10(CIFAR10):
        meta = {**CIFAR10.meta, "md5": None}  # check_integrity(path, None): exists only

        def _check_integrity(self):
            return all(os.path.isfile(os.path.join(self.root, self.base_folder, name))
                       for name, _md5 in self.train_list + self.test_list)

    return _Cifar10(root, train=train, download=False, transform=transform)


def _build_torch(mode, cfg):
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    gpu = cfg.device == "gpu"
    if mode.param("torchvision"):
        import torchvision.transforms as T
        dataset = torchvision_cifar10(cfg.data_dir, train=True, transform=T.Compose([
            T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(MEAN, STD)]))
    else:
        dataset = _PerSample(*load_in_memory(cfg.data_dir))
    # One iterator over a stream of epochs (a new permutation each 50,000
    # samples), never re-created: on the H200 machine (torch 2.11) a
    # DataLoader with persistent workers and pin_memory hung in the
    # iterator's reset at the first epoch boundary, and the timed epochs of
    # this baseline never ended. The workers and their per-sample work are
    # as in the reference loader; only the epoch boundary is the sampler's.
    sampler = RandomSampler(dataset, num_samples=len(dataset) * 100_000)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                        num_workers=os.cpu_count() or 1, pin_memory=gpu)

    class _ToDevice:
        def __iter__(self):
            for images, labels in loader:
                if gpu:
                    images = images.cuda(non_blocking=True)
                    labels = labels.cuda(non_blocking=True)
                yield images, labels
    del torch
    return _TorchRunner(_ToDevice(), gpu)


def _build_fastread_torch(mode, cfg):
    from fastread.torch import Cifar10Loader
    gpu = cfg.device == "gpu"
    in_memory = mode.param("in_memory")
    loader = Cifar10Loader(cfg.data_dir, batch_size=cfg.batch_size, augment=True,
                           random_shuffle=True, device="cuda" if gpu else "cpu",
                           engine=mode.engine, in_memory=True if in_memory is None else in_memory,
                           **cfg.engine_options)
    return _TorchRunner(loader, gpu)


# -- WebDataset ----------------------------------------------------------------------

def _check_wds_library(mode, cfg):
    from fastread.bench.environment import try_import
    for module in ("torch", "webdataset"):
        _m, why = try_import(module)
        if why:
            return f"{module} {why}"
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _check_wds_dali(mode, cfg):
    if mode.engine is not None:
        why = cfg.env.engine_error(mode.engine)
        if why:
            return why
    why = cfg.env.dali_error_for(fastread_reader=mode.engine is not None)
    if why:
        return why
    if cfg.device == "gpu" and cfg.env.cuda_error:
        return f"--device gpu needs a CUDA device; {cfg.env.cuda_error}"
    return None


def _build_wds_dali(mode, cfg):
    from fastread.bench.runners import DaliRunner

    def reader():
        if mode.engine is None:
            from nvidia.dali import fn
            jpg, cls = fn.readers.webdataset(paths=cfg.paths, ext=WDS_EXT,
                                             missing_component_behavior="empty", name="Reader")
        else:
            from fastread.dali.formats import webdataset
            native = mode.param("native")
            jpg, cls = webdataset(paths=cfg.paths, ext=WDS_EXT, engine=mode.engine,
                                  **({} if native is None else {"native": native}),
                                  **cfg.engine_options)
        return jpg, cls
    return DaliRunner(cfg, reader)


class _WdsRunner:
    """The webdataset library's loader, epoch after epoch; counts samples and
    the bytes delivered (encoded, or decoded with --decode)."""

    def __init__(self, cfg):
        import torch
        import webdataset as wds
        from torch.utils.data import DataLoader

        ds = wds.WebDataset(cfg.paths, shardshuffle=False)
        ds = (ds.decode("rgb8") if cfg.decode else ds).to_tuple("jpg;jpeg;png", "cls")
        workers = min(os.cpu_count() or 1, len(cfg.paths))
        # Decoded images differ in size: a batch is a list, as DALI's is.
        self.loader = DataLoader(ds.batched(cfg.batch_size, partial=True), batch_size=None,
                                 num_workers=workers, persistent_workers=workers > 0,
                                 pin_memory=False)
        self.gpu = cfg.device == "gpu"
        self._torch = torch
        self._it, self._keep = iter(self.loader), None

    def next(self):
        try:
            images, labels = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            images, labels = next(self._it)
        if self.gpu:
            torch = self._torch
            images = [torch.as_tensor(np.asarray(i)).cuda(non_blocking=True) for i in images]
            torch.cuda.current_stream().synchronize()
        self._keep = images
        return len(images), sum(np.asarray(i).nbytes if not hasattr(i, "nbytes") else i.nbytes
                                for i in images)

    def close(self):
        self._keep = self._it = self.loader = None


def _build_wds_library(mode, cfg):
    return _WdsRunner(cfg)


# -- Squirrel ------------------------------------------------------------------------

def _squirrel_shards(path):
    """The *.gz shards of a directory whose first shard holds MessagePack
    maps (gzip'd or not), else []."""
    import gzip
    shards = sorted(n for n in os.listdir(path) if n.endswith(".gz") and not n.endswith(".tar.gz"))
    if not shards:
        return []
    first = os.path.join(path, shards[0])
    try:
        with open(first, "rb") as f:
            head = f.read(2)
        if head == b"\x1f\x8b":
            with gzip.open(first, "rb") as f:
                head = f.read(1)
    except (OSError, EOFError):
        return []
    if head and not (0x80 <= head[0] <= 0x8f or head[0] in (0xde, 0xdf)):
        return []
    return [os.path.join(path, n) for n in shards]


def _check_squirrel(mode, cfg):
    from fastread.bench.environment import try_import
    for module in ("msgpack", "msgpack_numpy") + (("squirrel",) if mode.engine is None else ()):
        _m, why = try_import(module)
        if why:
            return f"{module} {why}"
    return _check_wds_dali(mode, cfg)


class _SquirrelBatches:
    """The tutorial's source: squirrel-core's iterator, batched in Python,
    an epoch at a time (StopIteration at its end)."""

    def __init__(self, url, batch_size):
        from squirrel.driver.msgpack import MessagepackDriver
        self.driver, self.batch_size = MessagepackDriver(url), batch_size
        self._it = None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self.driver.get_iter())
        images, labels = [], []
        for item in self._it:
            images.append(item["image"])
            labels.append(np.array([item["label"]], np.int64))
            if len(images) == self.batch_size:
                break
        if not images:
            self._it = None
            raise StopIteration
        return images, labels


def _build_squirrel(mode, cfg):
    from fastread.bench.runners import DaliRunner
    gpu = cfg.device == "gpu"

    def outputs():
        if mode.engine is None:
            from nvidia.dali import fn
            images, labels = fn.external_source(source=_SquirrelBatches(cfg.data_dir,
                                                                        cfg.batch_size),
                                                num_outputs=2, batch=True, cycle=False)
        else:
            from fastread.dali.formats import squirrel
            images, labels = squirrel(url=cfg.data_dir, keys=("image", "label"),
                                      engine=mode.engine, **cfg.engine_options)
        return (images.gpu(), labels.gpu()) if gpu else (images, labels)
    return DaliRunner(cfg, None, outputs=outputs)
