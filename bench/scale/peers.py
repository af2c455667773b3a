"""Peers of the scale family that do not install beside fastread's pins:
MosaicML streaming (MDS) and LitData, in their own venv, on their own
formats (the same samples as generate.py's, converted with each library's
writer).

    python bench/scale/peers.py venv [DIR]              # make / check the venv
    DIR/bin/python bench/scale/peers.py convert mds OUT N
    DIR/bin/python bench/scale/peers.py convert litdata OUT N

The venv (default /var/tmp/fastread-peers) sees the system site packages
(torch, numpy, DALI) and is constrained to their installed versions:
mosaicml-streaming 0.13 pins numpy<2.2 and pulls cloud SDKs, and litdata's
resolver finds no version with torch 2.13, so both are installed
``--no-deps`` and given only the modules they import (zstd, xxhash,
python-snappy, brotli, transformers<5, catalogue; lightning-utilities,
filelock; torchvision 0.28 without deps, which streaming.vision imports).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DEFAULT_VENV = "/var/tmp/fastread-peers"
#: (pip arguments) in order; each a separate pip call.
INSTALLS = (
    ("--no-deps", "mosaicml-streaming==0.13.0"),
    ("--no-deps", "litdata==0.2.76"),
    ("--no-deps", "torchvision==0.28.*"),
    ("zstd", "xxhash", "python-snappy", "brotli", "transformers<5", "catalogue<3,>=2",
     "lightning-utilities", "filelock"),
)
PROBE = "import streaming, litdata; from streaming import MDSWriter, StreamingDataset; " \
        "print(json.dumps({'streaming': streaming.__version__, 'litdata': litdata.__version__}))"


def probe(venv):
    """{'streaming': version, 'litdata': version} of the venv, or None and why."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        return None, f"no venv at {venv}"
    r = subprocess.run([py, "-c", "import json; " + PROBE], capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        return None, (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def ensure_venv(venv=DEFAULT_VENV, log=print):
    """Makes the peers' venv if its probe fails (network to PyPI needed).
    Returns (versions or None, why not)."""
    found, why = probe(venv)
    if found:
        return found, None
    import numpy
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    log(f"peers venv {venv}: {why}; installing (pip, a few minutes)")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                       check=True)
    constraints = os.path.join(venv, "constraints.txt")
    with open(constraints, "w") as f:
        f.write(f"numpy=={numpy.__version__}\n")
        if torch_version:
            f.write(f"torch=={torch_version}\n")
    pip = [os.path.join(venv, "bin", "pip"), "install", "-q", "-c", constraints]
    for args in INSTALLS:
        r = subprocess.run(pip + list(args), capture_output=True, text=True, timeout=900)
        if r.returncode:
            return None, f"pip install {' '.join(args)}: " + \
                (r.stderr.strip().splitlines() or ["failed"])[-1]
    return probe(venv)


def convert_mds(out, n):
    import shutil

    from streaming import MDSWriter

    from generate import label_of, sample_bytes

    if os.path.exists(out):
        shutil.rmtree(out)
    with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit="64mb") as w:
        for i in range(n):
            w.write({"jpg": sample_bytes(i), "cls": label_of(i, 1000)})


def convert_litdata(out, n):
    import shutil

    from litdata.streaming.writer import BinaryWriter

    from generate import label_of, sample_bytes

    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    w = BinaryWriter(out, chunk_bytes="64MB")
    for i in range(n):
        w[i] = {"jpg": sample_bytes(i), "cls": label_of(i, 1000)}
    w.done()
    w.merge()


def main(argv):
    if argv[:1] == ["venv"]:
        found, why = ensure_venv(argv[1] if len(argv) > 1 else DEFAULT_VENV)
        print(json.dumps(found) if found else f"peers venv: {why}")
        return 0 if found else 1
    if argv[:1] == ["convert"] and len(argv) == 4 and argv[1] in ("mds", "litdata"):
        out, n = argv[2], int(argv[3])
        (convert_mds if argv[1] == "mds" else convert_litdata)(out, n)
        with open(os.path.join(out, ".scale-dataset.json"), "w") as f:
            json.dump({"kind": argv[1], "n": n}, f)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
