"""The registry of ``fastread bench`` modes: families, datasets, selection.

A *mode* is one way of getting batches of samples out of a dataset: DALI's
``fn.readers.file``, the seed's Python external source, fastread's DALI
reader with engine ``io_uring``, ... Modes come in *families*, one module
each under :mod:`fastread.bench.families`; the registry finds every module
there (:func:`families`), so a new family -- the GPU feature-gather
benchmark, a record format -- is one new module and nothing else.

Writing a family
----------------
A family module defines::

    NAME = "gather"          # the family's name (--list-modes shows it)
    ORDER = 50               # where its modes sort (files 10, image 20, npy 30, xnvme 40)

    def modes(env):          # env: fastread.bench.environment.Environment
        yield Mode(name="gather-io_uring", family=NAME, dataset="files",
                   what="fastread.gather(engine='io_uring')",
                   help="one line for --list-modes",
                   engine="io_uring", role="fastread",
                   check=my_check, build=my_build)

* ``dataset`` is the kind of dataset the mode reads (:data:`DATASET_KINDS`):
  ``"files"`` (a tree of sample files, one directory per class, as
  ``fn.readers.file`` reads it), ``"image"`` (a packed image, ``fastread
  pack``) or ``"npy"`` (a tree of ``.npy`` arrays). A mode is attempted only
  on a dataset of its kind.

A family that reads a new kind of dataset (record files, say) brings it
along in the same module::

    add_dataset_kind("records", "a directory of record files")

    def detect(path):        # optional: a Dataset if path is one of ours, else None
        ...
        return Dataset(root=path, primary="records", kinds=("records",),
                       paths=files, samples=n, nbytes=total)

:func:`detect_dataset` asks every family's ``detect`` before its own rules
(a tree of sample files, of ``.npy`` arrays, a packed image); a ``detect``
raises :class:`BenchError` for a dataset of its kind that it cannot read.
* ``check(mode, cfg)`` says why the mode cannot run here with these settings
  (``cfg``: a :class:`fastread.bench.runners.Config`; ``cfg.env`` the
  environment, ``cfg.device`` cpu or gpu, ``cfg.dataset`` the
  :class:`Dataset` or None for ``--list-modes`` without one), or returns
  None. It must not raise and must be quick: it runs for every mode on
  ``--list-modes``.
* ``build(mode, cfg)`` returns a *runner* for one timed run: ``next()``
  returns ``(samples, bytes)`` of one batch, crossing epoch ends by itself
  and keeping the previous batch referenced until the next call, as a
  training step would; ``close()`` frees what it holds. The runners of
  :mod:`fastread.bench.runners` (a DALI pipeline, a Reader, a Python loop)
  cover most modes.
* ``default``: the devices (``"cpu"``, ``"gpu"``) on which the mode is part
  of the headline run, the one ``fastread bench DATA`` does without
  ``--modes``. Keep that run short: it answers "how much faster than
  DALI's own reader and a Python external source is fastread here?".
* ``dali``: True if the mode runs a DALI pipeline; the verdict sets the
  fastest DALI mode of fastread against the baseline, like for like.
* ``role``: ``"baseline"`` (what others are compared with: the "vs" column
  and the verdict), ``"python"`` (the plain-Python way), ``"fastread"``,
  or ``"reference"`` (a ceiling, not a reader). It colours the plot.

Mode names say what ran: ``reader-<engine>`` is a :class:`fastread.Reader`,
``read_files-<engine>`` the :func:`fastread.read_files` function, and
``what`` spells out the call. Names are unique across families (a clash is
an error naming both).

This module imports no family (they are found at run time), so families may
import it freely without an import cycle.
"""
import dataclasses
import fnmatch
import importlib
import math
import os
import pkgutil

#: Kinds of dataset a mode can read.
DATASET_KINDS = {
    "files": "a tree of sample files (one directory per class, as fn.readers.file reads it)",
    "image": "a packed image (fastread pack)",
    "npy": "a tree of .npy arrays (as fn.readers.numpy reads it)",
}



def add_dataset_kind(kind, description):
    """Registers a kind of dataset (a family's, at import)."""
    if DATASET_KINDS.get(kind, description) != description:
        raise ValueError(f"dataset kind {kind!r} is already registered as "
                         f"{DATASET_KINDS[kind]!r}")
    DATASET_KINDS[kind] = description


#: The package whose modules are the families.
FAMILY_PACKAGE = "fastread.bench.families"

ROLES = ("baseline", "python", "fastread", "reference")


class BenchError(ValueError):
    """A usage error of the benchmark (bad mode, dataset, option): one line."""


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    family: str
    dataset: str
    what: str
    help: str
    check: object
    build: object
    engine: str = None
    role: str = "fastread"
    default: tuple = ()
    #: runs a DALI pipeline (the verdict compares DALI modes with DALI modes)
    dali: bool = False
    #: extra settings the family's build reads (e.g. xNVMe's async engine)
    params: tuple = ()
    #: a reference mode whose GB/s is the ceiling the others are a share of
    #: (the table's "of ceiling" column); modes named ceiling-* are too
    ceiling: bool = False

    def __post_init__(self):
        if self.dataset not in DATASET_KINDS:
            raise ValueError(f"mode {self.name}: unknown dataset kind {self.dataset!r}")
        if self.role not in ROLES:
            raise ValueError(f"mode {self.name}: unknown role {self.role!r}")

    def unavailable(self, cfg):
        """Why this mode cannot run with ``cfg``, or None."""
        return self.check(self, cfg)

    def param(self, key, default=None):
        return dict(self.params).get(key, default)


# -- families ---------------------------------------------------------------------------
_found = {}  # package -> (families, broken)


def _discover(package):
    if package not in _found:
        pkg = importlib.import_module(package)
        found, broken = [], {}
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            try:
                mod = importlib.import_module(f"{package}.{info.name}")
                found.append((getattr(mod, "ORDER", 100), mod.NAME, mod))
            except Exception as e:  # a broken family must not break the others
                broken[info.name] = f"{type(e).__name__}: {e}"
        fams = {name: mod for _order, name, mod in sorted(found, key=lambda t: (t[0], t[1]))}
        _found[package] = (fams, broken)
    return _found[package]


def families(package=None):
    """Family name -> module, in ORDER, from every module of ``package``
    (default :data:`FAMILY_PACKAGE`); modules that fail to import are left out
    (:func:`broken_families` says why)."""
    return dict(_discover(package or FAMILY_PACKAGE)[0])


def broken_families(package=None):
    """Family module -> why it could not be imported."""
    return dict(_discover(package or FAMILY_PACKAGE)[1])


def family_main(name, package=None):
    """``main(argv) -> exit status`` of family ``name``, for a family that is
    a run of its own (``fastread bench --family NAME ...``: the scale
    family sweeps data sets it makes itself). BenchError naming the family
    when there is none or it has no ``main``."""
    fams = families(package)
    if name not in fams:
        why = broken_families(package).get(name)
        raise BenchError(f"--family {name}: " + (f"cannot be imported: {why}" if why else
                         f"no such family (families: {', '.join(fams)})"))
    main = getattr(fams[name], "main", None)
    if main is None:
        raise BenchError(f"--family {name}: the family has no run of its own; its modes run "
                         f"with `fastread bench DATA --modes ...`")
    return main


def all_modes(env, package=None):
    """Every mode of every family, in display order."""
    out, owner = [], {}
    for fname, mod in families(package).items():
        for m in mod.modes(env):
            if m.name in owner:
                raise RuntimeError(f"mode {m.name} is registered by families {owner[m.name]} "
                                   f"and {fname}")
            owner[m.name] = fname
            out.append(m)
    return out


def default_engine(env):
    """The engine engine='auto' picks: the first that reads files here (not a
    GPU-only engine), or None."""
    from fastread.engine import GPU_ENGINES

    for name, status in env.engines.items():
        if status.files is True and name not in GPU_ENGINES:
            return name
    return None


# -- datasets ---------------------------------------------------------------------------
@dataclasses.dataclass
class Dataset:
    """What DATA is: its kind (``primary``), the other kinds it can also be
    read as (a tree with its packed image beside it), its samples."""
    root: str
    primary: str
    kinds: tuple
    paths: list = None       # sample files of a files or npy tree
    labels: list = None
    image: str = None        # packed image, if one goes with it
    samples: int = 0
    nbytes: int = 0
    notes: tuple = ()
    #: read through this machine's page cache (False for objects on a
    #: server: --cache cold means nothing for them)
    page_cache: bool = True

    def describe(self):
        what = {"files": "file tree", "image": "packed image", "npy": ".npy tree",
                "s3": "S3 objects"}.get(
            self.primary) or DATASET_KINDS.get(self.primary, self.primary)
        also = [k for k in self.kinds if k != self.primary]
        extra = f" (and its packed image {self.image})" if "image" in also else ""
        return (f"{self.root}: {what}, {self.samples:,} samples, {self.nbytes / 1e9:.3f} GB"
                f"{extra}")


def is_url(path):
    """``scheme://...``: DATA that no local path check applies to (s3://)."""
    return isinstance(path, str) and "://" in path


def detect_dataset(path, image=None, package=None, engine_options=None):
    """The :class:`Dataset` at ``path``: what a family's ``detect`` says it
    is, else a directory of sample files (images, as ``fn.readers.file``
    indexes them), of ``.npy`` arrays, or a packed image file. ``image``
    (else ``$FASTREAD_BENCH_IMAGE``, else ``<path>.img`` if it exists) is a
    packed image of a file tree, read by the image modes. A URL
    (``s3://bucket/prefix``) is only a family's. ``engine_options`` (the
    --engine-option mapping) reach a ``detect(path, engine_options=None)``
    that takes them: an s3:// listing needs the endpoint. Raises BenchError
    naming the path."""
    import inspect

    import fastread

    if not is_url(path) and not os.path.exists(path):
        raise BenchError(f"DATA {path!r} does not exist")
    for mod in families(package).values():
        detect = getattr(mod, "detect", None)
        if detect is None:
            continue
        if "engine_options" in inspect.signature(detect).parameters:
            found = detect(path, engine_options=engine_options)
        else:
            found = detect(path)
        if found is not None:
            return found
    if is_url(path):
        scheme = path.split("://", 1)[0]
        raise BenchError(f"DATA {path!r}: no benchmark family reads {scheme}:// URLs "
                         "(`fastread bench --list-modes` lists the families)")
    if not os.path.isdir(path):
        img = _open_image(path, f"DATA {path!r} is neither a directory nor a packed image")
        return Dataset(root=path, primary="image", kinds=("image",), image=img.path,
                       samples=len(img), nbytes=int(img.lengths.sum()))
    try:
        paths, labels = fastread.scan(path)
    except (OSError, ValueError) as e:
        paths, labels, scan_error = [], [], e
    else:
        scan_error = None
    if paths:
        ds = Dataset(root=path, primary="files", kinds=("files",), paths=paths, labels=labels,
                     samples=len(paths), nbytes=_total_size(paths))
        _attach_image(ds, image)
        return ds
    from fastread.index import scan_numpy
    try:
        npys = scan_numpy(path)
    except (OSError, ValueError):
        npys = []
    if npys:
        return Dataset(root=path, primary="npy", kinds=("npy",), paths=npys,
                       labels=[0] * len(npys), samples=len(npys), nbytes=_total_size(npys))
    why = f" ({scan_error})" if scan_error else ""
    raise BenchError(f"DATA {path!r} holds no samples{why}: expected one directory per class "
                     "with image files, .npy arrays, or a packed image file")


def _total_size(paths):
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError as e:
            raise BenchError(f"sample {p}: {e.strerror or e}") from None
    return total


def _open_image(path, what):
    import fastread

    try:
        return fastread.PackedImage(path)
    except (OSError, ValueError) as e:
        raise BenchError(f"{what}: {e}") from None


def _attach_image(ds, image):
    explicit = image or os.environ.get("FASTREAD_BENCH_IMAGE")
    path = explicit or os.path.normpath(ds.root) + ".img"
    if not os.path.exists(path):
        if explicit:
            raise BenchError(f"packed image {path!r} does not exist")
        ds.notes += (f"no packed image at {path}: image modes need one "
                     f"(`fastread pack {ds.root} {path}`, or --image)",)
        return
    img = _open_image(path, f"packed image {path!r}")
    if len(img) != ds.samples:
        msg = (f"packed image {path} holds {len(img)} samples, {ds.root} {ds.samples}: "
               "pack it again")
        if explicit:
            raise BenchError(msg)
        ds.notes += (msg + "; image modes left out",)
        return
    ds.image = img.path
    ds.kinds = ds.kinds + ("image",)


def epoch_batches(samples, batch_size):
    return math.ceil(samples / batch_size)


# -- selection ---------------------------------------------------------------------------
def applies(mode, dataset):
    """Whether ``mode`` reads this kind of dataset (always, without one)."""
    return dataset is None or mode.dataset in dataset.kinds


def defaults(modes, dataset, device):
    """The headline run's modes for this dataset and device."""
    return [m for m in modes if device in m.default
            and (dataset is None or m.dataset == dataset.primary)]


def select(spec, modes, dataset, device):
    """(modes to attempt, explicit): ``spec`` None for the headline run,
    ``"all"`` for every mode that applies to the dataset, else comma-separated
    names or glob patterns (``reader-*``), in the order given."""
    if spec is None:
        return defaults(modes, dataset, device), False
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BenchError("--modes: no mode given")
    if names == ["all"]:
        return [m for m in modes if applies(m, dataset)], False
    by_name = {m.name: m for m in modes}
    chosen, unknown = [], []
    for n in names:
        if any(c in n for c in "*?["):
            hits = [m.name for m in modes if fnmatch.fnmatchcase(m.name, n)]
            if not hits:
                unknown.append(n)
            chosen += hits
        elif n in by_name:
            chosen.append(n)
        else:
            unknown.append(n)
    if unknown:
        raise BenchError(f"--modes: unknown mode{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}; `fastread bench --list-modes` lists them")
    return [by_name[n] for n in dict.fromkeys(chosen)], True
