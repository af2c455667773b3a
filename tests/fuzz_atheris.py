"""Coverage-guided fuzzing of fastread's Python parsers with atheris
(libFuzzer for Python: ``pip install atheris``), for developers: the CI
run (tests/test_fuzz_formats.py) is seeded and bounded, this one searches.

One target of tests/fuzz_targets.py per run; each input is that target's
mutated file (the index, for ``packed-image``), read for one epoch in this
process. An error that is a ValueError or OSError naming the file is the
parser's correct answer; anything else is re-raised, and libFuzzer saves
the input as ``crash-*``. Its own limits stand for the CI run's:
``-rss_limit_mb`` (memory), ``-timeout`` (a hang), a signal (a crash)::

    python tests/fuzz_atheris.py wds-tar --corpus /tmp/corpus-wds \\
        -max_total_time=600 -rss_limit_mb=2048 -timeout=20

``--corpus DIR`` fills DIR with the target's seeds first (then passes it
on to libFuzzer, which adds what it finds). A saved input reruns with
``python tests/fuzz_atheris.py wds-tar crash-...``. docs/untrusted.md has
the rest.
"""
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import atheris  # noqa: E402

with atheris.instrument_imports(include=["fastread"]):
    import fastread  # noqa: F401,E402
    import fastread.formats  # noqa: F401,E402
    import fastread.npy  # noqa: F401,E402

import fuzz_targets  # noqa: E402


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in fuzz_targets.TARGETS:
        sys.exit(f"usage: {sys.argv[0]} TARGET [--corpus DIR] [libFuzzer options and inputs]; "
                 f"targets: {', '.join(sorted(fuzz_targets.TARGETS))}")
    target = fuzz_targets.TARGETS[sys.argv[1]]
    args = [sys.argv[0]] + sys.argv[2:]
    seeds = target.seeds(random.Random(f"atheris:{target.name}:seeds"))
    main_name = target.main or "x.img.index"
    if "--corpus" in args:
        i = args.index("--corpus")
        corpus = args[i + 1]
        del args[i:i + 2]
        os.makedirs(corpus, exist_ok=True)
        for k, s in enumerate(seeds):
            with open(os.path.join(corpus, f"seed-{k}"), "wb") as f:
                f.write(s[main_name])
        args.append(corpus)
    work = tempfile.mkdtemp(prefix=f"fastread-atheris-{target.name}-")

    def one(data):
        files = dict(seeds[0])
        files[main_name] = data
        paths = {}
        for name, content in files.items():
            paths[name] = os.path.join(work, name)
            with open(paths[name], "wb") as f:
                f.write(content)
        try:
            target.run(paths, work)
        except BaseException as e:  # noqa: BLE001 - judged below
            if fuzz_targets.classify(e, paths[main_name]) != "clean":
                raise

    atheris.Setup(args, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
