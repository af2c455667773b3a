"""Every ```python block of README.md and docs/*.md runs as printed.

Each block runs in a fresh interpreter, in a fresh working directory, so a
relative path in a snippet (``data/train``) is the data the snippet made or
the fixture below made there. HTML comments on the lines right above a
block's fence say what it needs:

``<!-- gpu -->``
    a CUDA device (skipped without one, saying why);
``<!-- needs: torch, nvidia.dali -->``
    modules that must import (skipped when one does not, saying why);
``<!-- fixture: imagenet, cifar10 -->``
    data this test makes in the working directory first (:data:`FIXTURES`);
``<!-- continues -->``
    the block goes on from the one before it in the same file (that block's
    code runs first, in the same interpreter, with its markers).

Blocks in other languages (``sh``, ``text``) are not run.
"""
import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))

#: fixture name -> Python run in the working directory before the block.
#: Fixtures that are servers, not files: "s3" starts the real S3 server
#: (tests/s3_server.py), puts a small class tree at s3://bucket/train/ and
#: hands the block the AWS_* environment that reaches it.
#: "cassandra" starts the real Cassandra node (tests/cassandra_server.py),
#: makes imagenette.data_train with a few rows and hands the block
#: CASSANDRA_HOST, CASSANDRA_PORT, CASSANDRA_USERNAME, CASSANDRA_PASSWORD.
SERVER_FIXTURES = ("s3", "cassandra")

FIXTURES = {
    # 2 classes x 128 small JPEGs (README.md's first block makes the same count).
    "imagenet": "from fastread.datasets import make_imagenet_like\n"
                "make_imagenet_like('data/train', classes=2, per_class=128, mean_kb=2,"
                " width=64, height=48, progress=False)\n",
    # data/cifar10/cifar-10-batches-bin/ (and the pickled batches).
    "cifar10": "from fastread.datasets import make_cifar10\n"
               "make_cifar10('data/cifar10', train_per_class=26, test_per_class=5)\n",
    # data/shards/shard-*.tar: jpg, cls, json per sample.
    "webdataset": "from fastread.datasets import make_webdataset\n"
                  "make_webdataset('data/shards', shards=3, per_shard=100, width=32, height=32)\n",
    "squirrel": "from fastread.datasets import make_squirrel\n"
                "make_squirrel('data/squirrel', samples=300, per_shard=100, shape=(3, 32, 32),"
                " workers=1)\n",
    "npy": "from fastread.datasets import make_npy_dataset\n"
           "make_npy_dataset('data/npy', classes=2, per_class=40, shape=(3, 32, 32),"
           " progress=False)\n",
    # data/imagenet-1k/data/train-0000N-of-00002.parquet: the HF layout of 2 x 32 JPEGs.
    "parquet": "from fastread.datasets import make_imagenet_like\n"
               "from fastread.formats.parquet import write_image_parquet\n"
               "make_imagenet_like('data/pq-tree', classes=2, per_class=32, mean_kb=2,"
               " width=64, height=48, progress=False)\n"
               "write_image_parquet('data/pq-tree', 'data/imagenet-1k', files=2, rows_per_group=16)\n",
    # a 2-D float32 table: 100,000 rows of 16.
    "features": "import os, numpy as np\n"
                "os.makedirs('data', exist_ok=True)\n"
                "np.save('data/features.npy', np.random.default_rng(0)"
                ".random((100_000, 16), dtype=np.float32))\n",
}

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(gpu|continues|needs:|fixture:)\s*(.*?)\s*-->\s*$")


def blocks(path):
    """[(line, language, code, markers)]: every fenced block of a Markdown
    file; markers is {"gpu": True, "needs": [...], "fixture": [...],
    "continues": True} from the comments right above its fence."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        code = "\n".join(lines[i + 1:j]) + "\n"
        markers = {"needs": [], "fixture": []}
        k = start - 1
        while k >= 0 and (MARKER.match(lines[k]) or not lines[k].strip()):
            mk = MARKER.match(lines[k])
            if mk:
                kind, arg = mk.group(1).rstrip(":"), mk.group(2)
                if kind in ("needs", "fixture"):
                    markers[kind] += [a.strip() for a in arg.split(",") if a.strip()]
                else:
                    markers[kind] = True
            k -= 1
        out.append((start + 1, lang, code, markers))
        i = j + 1
    return out


def python_blocks():
    params = []
    for path in DOCS:
        prev = None
        for line, lang, code, markers in blocks(path):
            if lang != "python":
                continue
            if markers.get("continues"):
                if prev is None:
                    raise AssertionError(f"{path}:{line}: 'continues' with no block before it")
                code = prev[0] + code
                markers = {"needs": prev[1]["needs"] + markers["needs"],
                           "fixture": prev[1]["fixture"] + markers["fixture"],
                           "gpu": prev[1].get("gpu") or markers.get("gpu")}
            prev = (code, markers)
            name = f"{os.path.relpath(path, ROOT)}:{line}"
            params.append(pytest.param(code, markers, id=name))
    return params


_cuda = []
_made = {}


def fixture_data(name, tmp_path_factory):
    """The data/ directory fixture `name` makes, made once a session (the
    blocks get symlinks to its entries in their own data/)."""
    if name not in _made:
        where = tmp_path_factory.mktemp(f"fixture-{name}")
        p = subprocess.run([sys.executable, "-c", FIXTURES[name]], cwd=where,
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0 and "ModuleNotFoundError" in p.stderr:
            _made[name] = pytest.skip.Exception(
                f"fixture {name}: {p.stderr.strip().splitlines()[-1]}")
        else:
            assert p.returncode == 0, f"fixture {name}:\n{p.stderr}"
            _made[name] = str(where / "data")
    if isinstance(_made[name], BaseException):
        raise _made[name]
    return _made[name]


def s3_fixture(request):
    """The environment a block marked <!-- fixture: s3 --> runs with: the
    session's S3 server (skipped where it or the s3 engine is missing),
    holding s3://bucket/train/{cat,dog}/N.jpg."""
    from conftest import s3_engine_reason, skip_unless
    skip_unless("s3", s3_engine_reason())
    server = request.getfixturevalue("s3_server")
    if "s3" not in _made:
        server.make_bucket("bucket")
        for c, cls in enumerate(("cat", "dog")):
            for i in range(3):
                server.put("bucket", f"train/{cls}/{i}.jpg", bytes([c, i]) * 100)
        _made["s3"] = True
    return server.env()


def cassandra_fixture(request):
    """The environment a block marked <!-- fixture: cassandra --> runs with:
    the session's Cassandra node (skipped where it cannot run), holding
    imagenette.data_train and metadata_train with 6 rows."""
    server = request.getfixturevalue("cassandra_server")
    if "cassandra" not in _made:
        import uuid
        from fastread.cassandra_tools import create_tables
        s = server.session()
        create_tables(s, "imagenette", "train")
        for i in range(6):
            u = uuid.uuid4()
            s.execute("INSERT INTO imagenette.data_train (id, label, data) VALUES (%s, %s, %s)",
                      (u, i % 2, bytes([i]) * 100))
            s.execute("INSERT INTO imagenette.metadata_train (id, label, or_label, or_split) "
                      "VALUES (%s, %s, %s, 'train')", (u, i % 2, f"c{i % 2}"))
        _made["cassandra"] = True
    return {"CASSANDRA_HOST": server.host, "CASSANDRA_PORT": str(server.port),
            "CASSANDRA_USERNAME": server.username, "CASSANDRA_PASSWORD": server.password}


def cuda_reason():
    """None if a CUDA device is visible, else why not (asked once)."""
    if not _cuda:
        from fastread.bench.environment import cuda_devices
        devices, why = cuda_devices()
        _cuda.append(None if devices else why or "no CUDA device")
    return _cuda[0]


def test_the_docs_have_python_blocks_and_known_markers():
    assert os.path.exists(DOCS[0]), "needs the checkout's README.md"
    seen = python_blocks()
    assert len(seen) >= 10
    for p in seen:
        unknown = set(p.values[1]["fixture"]) - set(FIXTURES) - set(SERVER_FIXTURES)
        assert not unknown, f"{p.id}: unknown fixture(s) {sorted(unknown)}"


@pytest.mark.skipif(not os.path.exists(DOCS[0]), reason="needs the checkout's README.md")
@pytest.mark.parametrize("code,markers", python_blocks())
def test_snippet_runs_as_printed(code, markers, tmp_path, tmp_path_factory, request):
    if markers.get("gpu"):
        why = cuda_reason()
        if why:
            pytest.skip(f"marked <!-- gpu -->: no CUDA device here ({why})")
    for mod in markers["needs"]:
        pytest.importorskip(mod, reason=f"marked <!-- needs: {mod} -->")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if "s3" in markers["fixture"]:
        env.update(s3_fixture(request))
    if "cassandra" in markers["fixture"]:
        env.update(cassandra_fixture(request))
    for name in dict.fromkeys(markers["fixture"]):
        if name in SERVER_FIXTURES:
            continue
        made = fixture_data(name, tmp_path_factory)
        os.makedirs(tmp_path / "data", exist_ok=True)
        for entry in os.listdir(made):
            os.symlink(os.path.join(made, entry), tmp_path / "data" / entry)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, ("the snippet failed as printed:\n"
                               + textwrap.indent(code, "    ") + "\n" + p.stdout + p.stderr)
