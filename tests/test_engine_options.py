"""EngineOptions: one object for the engine options, checked where options
enter (the object, Reader's and read_files' keywords, options= mappings,
environment defaults), with the option's name in every error."""
import dataclasses

import pytest

import fastread
from fastread.engine import (GPU_OPTION_NAMES, OPTION_NAMES, URL_OPTIONS, XNVME_OPTIONS,
                             EngineOptions, options)

# (option, a bad value): zero, negative, out of range and wrong types.
BAD_VALUES = [
    ("queue_depth", 0), ("queue_depth", -1), ("queue_depth", 5000), ("queue_depth", "8"),
    ("queue_depth", 1.5), ("queue_depth", True),
    ("threads", -1), ("threads", 2000), ("threads", "4"), ("threads", 2.0),
    ("direct_alignment", 0), ("direct_alignment", -4096), ("direct_alignment", 1000),
    ("direct_alignment", "4096"), ("direct_alignment", 1 << 32),
    ("o_direct", "yes"), ("o_direct", 2), ("o_direct", -1),
    ("register_buffers", "no"), ("register_files", 0.0),
    ("engine_args", 5), ("engine_args", ["be=linux"]),
    ("device_id", -2), ("device_id", "0"), ("device_id", 1.0),
    ("pin_memory", "on"),
    ("spin_us", -1), ("spin_us", 100001), ("spin_us", "50"), ("spin_us", 5.0),
]


@pytest.mark.parametrize("name,value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_value_is_named_everywhere_it_enters(name, value, edge_tree):
    root, content = edge_tree
    some_file = sorted(content)[0]
    entries = {
        "EngineOptions": lambda: EngineOptions(**{name: value}),
        "Reader keyword": lambda: fastread.Reader(root, **{name: value}),
        "Reader options=": lambda: fastread.Reader(root, options={name: value}),
        "read_files keyword": lambda: fastread.read_files([some_file], **{name: value}),
        "engine.options": lambda: options("psync", **{name: value}),
    }
    for where, call in entries.items():
        with pytest.raises(ValueError, match=name) as e:
            call()
        assert repr(value) in str(e.value), f"{where}: {e.value}"


def test_good_values_are_kept_and_normalised():
    o = EngineOptions(queue_depth=8, threads=0, o_direct=1, direct_alignment=512,
                      register_files=False, engine_args="")
    assert (o.queue_depth, o.threads, o.o_direct, o.direct_alignment) == (8, 0, True, 512)
    resolved = o.resolve("psync")
    assert resolved["o_direct"] is True and resolved["register_files"] is False
    assert set(resolved) == set(OPTION_NAMES + GPU_OPTION_NAMES)


def test_unknown_option_is_a_type_error_naming_it(edge_tree):
    root, _ = edge_tree
    with pytest.raises(TypeError, match="'queue_dept'"):
        EngineOptions.coerce(queue_dept=4)
    with pytest.raises(TypeError, match="'queue_dept'"):
        fastread.Reader(root, queue_dept=4)
    with pytest.raises(TypeError, match="'queue_dept'"):
        fastread.Reader(root, options={"queue_dept": 4})
    with pytest.raises(TypeError, match="options must be an EngineOptions"):
        fastread.Reader(root, options=[("queue_depth", 4)])


def test_option_given_twice_is_refused(edge_tree):
    root, _ = edge_tree
    with pytest.raises(TypeError, match="'queue_depth' given twice"):
        fastread.Reader(root, options=EngineOptions(queue_depth=8), queue_depth=16)


def test_defaults_come_from_the_environment_at_resolve_time(monkeypatch):
    o = EngineOptions(threads=3)
    monkeypatch.setenv("FASTREAD_QUEUE_DEPTH", "16")
    assert o.resolve("psync")["queue_depth"] == 16
    monkeypatch.setenv("FASTREAD_QUEUE_DEPTH", "32")
    assert o.resolve("psync")["queue_depth"] == 32
    assert EngineOptions(queue_depth=8).resolve("psync")["queue_depth"] == 8  # explicit wins
    assert o.resolve("psync")["threads"] == 3


@pytest.mark.parametrize("var,value,name", [("FASTREAD_QUEUE_DEPTH", "0", "queue_depth"),
                                            ("FASTREAD_THREADS", "-3", "threads"),
                                            ("FASTREAD_DIRECT_ALIGNMENT", "1000",
                                             "direct_alignment"),
                                            ("FASTREAD_SPIN_US", "-5", "spin_us")])
def test_bad_environment_default_names_option_and_variable(monkeypatch, edge_tree, var, value,
                                                           name):
    root, _ = edge_tree
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=f"{name} .*got {value} \\(from {var}\\)"):
        fastread.Reader(root)


def test_reader_takes_the_object_and_the_old_keywords_alike(edge_tree):
    root, content = edge_tree
    paths, _ = fastread.scan(root)
    opts = EngineOptions(threads=2, queue_depth=8)
    with fastread.Reader(root, batch_size=5, engine="psync", options=opts) as a, \
            fastread.Reader(root, batch_size=5, engine="psync", threads=2, queue_depth=8) as b:
        assert a.options == b.options == opts
        got = [[x.tobytes() for arrays, _ in r for x in arrays] for r in (a, b)]
    assert got[0] == got[1] == [content[p] for p in paths]
    arrays = fastread.read_files(paths[:3], options={"threads": 2})
    assert [x.tobytes() for x in arrays] == [content[p] for p in paths[:3]]


def test_gpu_output_is_an_option_of_the_object():
    assert EngineOptions().resolve("psync")["device_id"] == -1  # no GPU unless asked
    o = EngineOptions(device_output=True).resolve("psync")
    assert o["device_output"] is True and o["device_id"] == 0


def test_frozen_and_repr_shows_what_was_set():
    o = EngineOptions(queue_depth=8, o_direct=True)
    assert repr(o) == "EngineOptions(queue_depth=8, o_direct=True)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.queue_depth = 4
    with pytest.raises(ValueError, match="queue_depth"):
        o.replace(queue_depth=0)


def test_fields_are_every_option_the_engines_take():
    names = {f.name for f in dataclasses.fields(EngineOptions)}
    assert names == (set(OPTION_NAMES) | set(GPU_OPTION_NAMES) | set(XNVME_OPTIONS) |
                     set(URL_OPTIONS))
