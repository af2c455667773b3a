"""Tests parametrized over engines skip, naming the engine and why, where
the engine is not built or cannot run here (issue 39: io_uring without
liburing failed 8 tests on a GPU machine instead of skipping them).

The mechanism is conftest.py's collection hook (engine_skip_reason): a
case's `engine` parameter, or a dict parameter's "engine" entry, names the
engine. These tests check the hook's rule, and that every test module names
its engines that way, so that a new test cannot slip past it: a literal list
of engine names under another parameter name, or looped over inside a
test's body, fails here, on any machine.
"""
import ast
import os

import pytest

from conftest import engine_skip_reason, engines_in_params
from fastread.engine import KNOWN_ENGINES

HERE = os.path.dirname(os.path.abspath(__file__))

#: Parameters whose values are named like engines but are not fastread's
#: engines, with why.
NOT_ENGINES = {"xasync": "xNVMe's own async backends (one is called io_uring)"}

#: Engines every build has (the core's own): no test needs to skip them.
ALWAYS_BUILT = {"psync"}

OPTIONAL_ENGINES = set(KNOWN_ENGINES) - ALWAYS_BUILT


def fake_unavailable(name):
    return "engine io_uring: not built: liburing was not found" if name == "io_uring" else None


# The cases' parameters as (name, value) pairs: as dicts, the hook under
# test would skip these very cases where io_uring is absent.
@pytest.mark.parametrize("pairs, skipped", [
    ((("engine", "io_uring"),), True),
    ((("engine", "psync"),), False),
    ((("engine", "auto"),), False),                    # not an engine name: the test decides
    ((("op_kw", (("engine", "io_uring"), ("dense", False))),), True),
    ((("op_kw", (("dense", False),)),), False),
    ((("kw", (("engine", "psync"),)), ("o_direct", True)), False),
    ((("xasync", "io_uring"),), False),                # xNVMe's backend, not our engine
])
def test_the_rule(pairs, skipped):
    params = {k: dict(v) if isinstance(v, tuple) else v for k, v in pairs}
    why = engine_skip_reason(params, unavailable=fake_unavailable)
    assert (why is not None) is skipped
    if skipped:
        assert why.startswith("engine io_uring: ")


def test_required_engines_fail_instead(monkeypatch):
    """FASTREAD_TEST_REQUIRE=io_uring: no skip, so the case fails where the
    engine is missing, as the other required pieces do."""
    monkeypatch.setenv("FASTREAD_TEST_REQUIRE", "s3,io_uring")
    assert engine_skip_reason(dict(engine="io_uring"), unavailable=fake_unavailable) is None


def test_engines_in_params():
    assert engines_in_params(dict(engine="cufile", device="gpu",
                                  kw=dict(engine="psync"), other=dict(x=1))) == ["cufile", "psync"]


# -- every module names its engines so ------------------------------------------

def _modules():
    for name in sorted(os.listdir(HERE)):
        if name.startswith("test_") and name.endswith(".py") and name != os.path.basename(__file__):
            with open(os.path.join(HERE, name)) as f:
                yield name, ast.parse(f.read(), name)


def _module_literals(tree):
    """Module-level NAME = <literal> assignments (lists used in parametrize)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _engine_strings(node, literals, *, under_engine_key=False):
    """(engine name, whether it is the value of a dict's "engine" key) for
    every string constant naming an engine in `node` (a Name resolved to its
    module-level literal)."""
    if isinstance(node, ast.Name) and node.id in literals:
        yield from _engine_strings(literals[node.id], literals)
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in OPTIONAL_ENGINES:
            yield node.value, under_engine_key
        return
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            key = k.value if isinstance(k, ast.Constant) else None
            yield from _engine_strings(v, literals, under_engine_key=key == "engine")
        return
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
        for kw in node.keywords:
            yield from _engine_strings(kw.value, literals, under_engine_key=kw.arg == "engine")
        for a in node.args:
            yield from _engine_strings(a, literals)
        return
    for child in ast.iter_child_nodes(node):
        yield from _engine_strings(child, literals)


def _parametrize_calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "parametrize" and len(node.args) >= 2 and \
                isinstance(node.args[0], ast.Constant):
            yield node


def test_engine_parametrizations_name_their_engine():
    found = []
    for name, tree in _modules():
        literals = _module_literals(tree)
        for call in _parametrize_calls(tree):
            argnames = [a.strip() for a in call.args[0].value.split(",")]
            if any(a in NOT_ENGINES for a in argnames):
                continue
            for engine, keyed in _engine_strings(call.args[1], literals):
                if not keyed and "engine" not in argnames:
                    found.append(f"{name}:{call.lineno}: parametrize({call.args[0].value!r}, ...) "
                                 f"lists engine {engine!r}")
    assert not found, ("name an engine parameter `engine` (or put it under a dict's "
                       "\"engine\" key) so that conftest's hook skips it where the engine is "
                       "absent:\n" + "\n".join(found))


def _binds_engine(target):
    return any(isinstance(n, ast.Name) and n.id == "engine" for n in ast.walk(target))


def _asks_availability(node):
    """Whether `node` consults what runs here (engines(), available_engines,
    a status's .files / .ranges, a skip)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ("files", "ranges", "skip"):
            return True
        if isinstance(n, ast.Name) and n.id in ("engines", "available_engines"):
            return True
    return False


def test_no_test_loops_over_engine_names():
    """A loop over literal engine names inside one test fails it whole where
    one engine is missing: each engine must be a case of its own
    (parametrize), unless the loop or the test asks what runs here."""
    found = []
    for name, tree in _modules():
        literals = _module_literals(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or any(
                    "skip" in ast.unparse(d) or ast.unparse(d).startswith("needs_")
                    for d in fn.decorator_list):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.For) or not _binds_engine(node.target):
                    continue
                names = sorted({e for e, _ in _engine_strings(node.iter, literals)})
                if names and isinstance(node.iter, (ast.List, ast.Tuple, ast.Name)) and \
                        not _asks_availability(node):
                    found.append(f"{name}:{node.lineno}: {fn.name} loops over "
                                 f"{', '.join(names)}")
    assert not found, "parametrize over engines instead:\n" + "\n".join(found)
