"""The layering rules of ARCHITECTURE.md, checked on the source tree.

- Python: no import cycles inside the fastread package, counting imports at
  any depth (a function-level import is still a dependency), except those
  under ``if TYPE_CHECKING:``.
- C: no cycles between the core's object files (who calls whom, from the
  symbols each object defines and references), nor between its headers; the
  bottom layer (base.c / base.h) depends on nothing of ours.
"""
import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "fastread"
CSRC = ROOT / "csrc"


def find_cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_find_cycles_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# ------------------------------------------------------------------ Python

def python_modules():
    mods = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    # Cython modules are leaves here (they adapt the C core and import no
    # Python module of ours at import time); list them so that
    # `from fastread import _core` resolves to them, not to the package.
    for path in PKG.rglob("*.pyx"):
        mods[".".join(path.relative_to(PKG.parent).with_suffix("").parts)] = (None, False)
    return mods


def _type_checking_lines(tree):
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    for sub in ast.walk(child):
                        if hasattr(sub, "lineno"):
                            skip.add(sub.lineno)
    return skip


def python_import_graph():
    mods = python_modules()
    graph = {m: set() for m in mods}

    def resolve(target):
        # The longest known module that `target` names (a.b.name -> a.b).
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    for mod, (path, is_pkg) in mods.items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import name`: a submodule if there is one, else pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                if t.split(".")[0] != "fastread":
                    continue
                r = resolve(t)
                if r and r != mod:
                    graph[mod].add(r)
    return graph


def test_python_has_no_import_cycles():
    cycles = find_cycles(python_import_graph())
    assert not cycles, f"import cycles in fastread: {cycles}"


# ----------------------------------------------------------------------- C

def c_sources(*suffixes):
    """The core's sources (tests excluded), by their path under csrc/."""
    return sorted(p for p in CSRC.rglob("*") if p.suffix in suffixes
                  and p.relative_to(CSRC).parts[0] != "tests")


def _include_target(path, inc):
    """What `#include "inc"` in `path` names: csrc/include/ for public headers,
    csrc/ for internal ones, else the including file's folder (device
    headers include their neighbours)."""
    for base in (CSRC / "include", CSRC, path.parent):
        if (base / inc).exists():
            return (base / inc).resolve().relative_to(CSRC).as_posix()
    return None


def c_include_graph():
    graph = {}
    for path in c_sources(".c", ".h", ".cuh"):
        name = path.relative_to(CSRC).as_posix()
        incs = re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M)
        graph[name] = {t for t in (_include_target(path, i) for i in incs) if t} - {name}
    return graph


def test_c_headers_have_no_include_cycles():
    cycles = find_cycles({k: v for k, v in c_include_graph().items() if k.endswith(".h")})
    assert not cycles, f"#include cycles among csrc headers: {cycles}"


def test_c_bottom_layer_includes_nothing_of_ours():
    graph = c_include_graph()
    assert graph["core/base.h"] == set() and graph["core/base.c"] <= {"core/base.h"}


def test_c_subsystems_are_folders():
    """ARCHITECTURE.md's map: every core source lives in a subsystem folder,
    none loose in csrc/, and public headers include only public headers."""
    folders = {"include", "core", "engines", "gpu", "gather", "formats"}
    loose = [p.name for p in c_sources(".c", ".h") if p.parent == CSRC]
    assert not loose, f"sources loose in csrc/: {loose}"
    assert {p.relative_to(CSRC).parts[0] for p in c_sources(".c", ".h")} <= folders
    graph = c_include_graph()
    for name, incs in graph.items():
        if name.startswith("include/"):
            assert all(i.startswith("include/") for i in incs), (name, incs)


def _cflags():
    flags = ["-std=c11", "-I", str(CSRC / "include"), "-I", str(CSRC), "-DFASTREAD_HAVE_URING=1", "-DFASTREAD_HAVE_XNVME=1",
             '-DFASTREAD_XNVME_BUILD_VERSION="layering"']
    if shutil.which("pkg-config"):
        for lib in ("liburing", "xnvme"):
            r = subprocess.run(["pkg-config", "--cflags", lib], capture_output=True, text=True)
            if r.returncode == 0:
                flags += r.stdout.split()
    return flags


# Sources that need a library the machine may lack; they are left out of the
# graph (with the reason) only when their headers are missing.
OPTIONAL = {"engines/uring/": "liburing.h", "engines/xnvme/xnvme.c": "libxnvme.h",
            "engines/xnvme/xnvme_file.c": "libxnvme.h", "gather/gather_xnvme_cuda.c": "libxnvme.h"}


def _optional_header(name):
    return next((h for prefix, h in OPTIONAL.items() if name.startswith(prefix)), None)


@pytest.fixture(scope="module")
def c_objects(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc or not shutil.which("nm"):
        pytest.skip("needs a C compiler and nm")
    out = tmp_path_factory.mktemp("layering")
    objects, left_out = {}, {}
    for src in c_sources(".c"):
        name = src.relative_to(CSRC).as_posix()
        obj = out / (name.replace("/", "__")[:-2] + ".o")
        r = subprocess.run([cc, *_cflags(), "-c", str(src), "-o", str(obj)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            missing = _optional_header(name)
            if missing and f"{missing}: No such file" in r.stderr:
                left_out[name] = f"{missing} not found"
                continue
            pytest.fail(f"{name} does not compile:\n{r.stderr[-2000:]}")
        objects[name] = obj
    return objects, left_out


def c_symbol_graph(objects):
    defined, undefined = {}, {}
    for name, obj in objects.items():
        r = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True, check=True)
        defs, undefs = set(), set()
        for line in r.stdout.splitlines():
            fields = line.split()
            if len(fields) < 2:
                continue
            sym, kind = fields[0], fields[1]
            if kind == "U":
                undefs.add(sym)
            elif kind in "TDBRCVW":
                defs.add(sym)
        defined[name], undefined[name] = defs, undefs
    owner = {s: n for n, defs in defined.items() for s in defs}
    return {n: {owner[s] for s in undefined[n] if s in owner} - {n} for n in objects}


def test_c_objects_have_no_cycles(c_objects):
    objects, _ = c_objects
    graph = c_symbol_graph(objects)
    assert not find_cycles(graph), f"call cycles between csrc objects: {find_cycles(graph)}"
    assert graph["core/base.c"] == set(), f"base.c depends on {graph['core/base.c']}"
