"""Reads the first N files of the 4 KiB set (bench/engines/engines.py makes it)
with one engine, in read_files() batches of 64: what syscalls_per_file.sh
counts under strace.  python read_4k.py ENGINE ASYNC N   (ASYNC: xnvme-file's async=, or -)"""
import os
import sys

import fastread

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, *[".."] * 4, "bench", "engines"))
from engines import list_files  # noqa: E402

eng, a, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
paths = list_files("/var/tmp/fastread-bench/engines-4k")[:n]
o = {"xnvme_async": a} if eng == "xnvme-file" else {}
for i in range(0, n, 64):
    fastread.read_files(paths[i:i + 64], engine=eng, **o)
