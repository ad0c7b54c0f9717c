"""Every Python package the test run imports is declared.

`scripts/setup` installs scripts/requirements-test.txt into the venv the
tests run in; a package a test imports but that file does not name works
on a machine that happens to have it and fails on a fresh one. This test
reads, without running them, the imports of

 * every .py file under tests/,
 * the Python scripts the test run executes: scripts/run_tests.py,
   scripts/bench-summary, and each script a test names as a path
   (`REPO / "scripts" / "bench-batching"`, "scripts/ref/x.py" as an
   argument), and
 * the local modules those import (scripts/ref/*.py, clients/python/...),
   followed transitively, at their module level, and
 * the `import` lines of the Python here-documents in the shell scripts
   `scripts/test` runs (setup, fetch-model, fetch-llamacpp-vendor),

and checks each imported top-level module that is neither the standard
library (sys.stdlib_module_names) nor a local module against the package
names in the requirements files. An import guarded by `try: ... except
ImportError` or made with `pytest.importorskip` is optional (the test
skips, or the script says what to install): its package may be declared in
any scripts/requirements-*.txt instead (llama-cpp-python, the reference
that `scripts/setup --with-llamacpp` adds).
"""
import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO

# Reads files only: skipped under the sanitizers (conftest.py).
pytestmark = pytest.mark.no_zinfer

REQ_TEST = REPO / "scripts" / "requirements-test.txt"
# Shell scripts of the test run whose here-documents run Python: their
# `import x` / `from x import` lines count too.
SHELL_RUN = ["test", "setup", "fetch-model", "fetch-llamacpp-vendor"]
# Where local modules live (a test or script puts these on sys.path).
LOCAL_DIRS = [REPO / "tests" / "e2e", REPO / "scripts" / "ref", REPO / "clients" / "python",
              REPO / "scripts"]
# Import names whose package is named otherwise (PyPI spelling).
PACKAGE_OF = {
    "yaml": "PyYAML",
    "llama_cpp": "llama-cpp-python",
    "zmq": "pyzmq",
    "prometheus_client": "prometheus-client",
    "jinja2": "Jinja2",
    "google": "protobuf",
    "sklearn": "scikit-learn",
    "PIL": "Pillow",
    "cv2": "opencv-python",
    "dateutil": "python-dateutil",
    "sentencepiece": "sentencepiece",
    "pydantic_settings": "pydantic-settings",
    "sse_starlette": "sse-starlette",
    "starlette_context": "starlette-context",
}


def norm(name):
    """PEP 503 normalisation: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(path):
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(norm(re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]))
    return names


def is_python(path):
    if path.suffix == ".py":
        return True
    with open(path, "rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and b"python" in first


def local_module(name):
    for d in LOCAL_DIRS:
        if (d / f"{name}.py").is_file():
            return d / f"{name}.py"
        if (d / name / "__init__.py").is_file():
            return d / name / "__init__.py"
    return None


def path_parts(node):
    """The string parts of `X / "a" / "b"` (a pathlib expression)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left = path_parts(node.left)
        if isinstance(node.right, ast.Constant) and isinstance(node.right.value, str):
            return left + [node.right.value]
        return left
    return []


def guarded(node, parents):
    """Inside a try whose handlers catch ImportError (or broader)?"""
    child = node
    for p in reversed(parents):
        if isinstance(p, ast.Try) and child in p.body:
            for h in p.handlers:
                names = []
                if h.type is None:
                    return True
                for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]):
                    if isinstance(t, ast.Name):
                        names.append(t.id)
                if {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names):
                    return True
        child = p
    return False


def scan(path, module_level):
    """(imports: [(module, optional)], scripts named: [Path]) of one file;
    with module_level, only what importing it runs (not function bodies)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports, scripts = [], []
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}

    def visit(node, parents):
        if isinstance(node, ast.Import):
            for a in node.names:
                imports.append((a.name.split(".")[0], guarded(node, parents)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports.append((node.module.split(".")[0], guarded(node, parents)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant)):
            imports.append((node.args[0].value.split(".")[0], True))
        elif isinstance(node, ast.BinOp) and not (parents and isinstance(parents[-1], ast.BinOp)):
            parts = path_parts(node)
            if "scripts" in parts:
                scripts.append(REPO.joinpath(*parts[parts.index("scripts"):]))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and re.fullmatch(r"scripts/[\w./-]+", node.value)):
            scripts.append(REPO / node.value)
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        for c in ast.iter_child_nodes(node):
            visit(c, parents + [node])

    visit(tree, [])
    return imports, scripts


def executed_files():
    """{path: imports} of the files the test run executes: run ones whole,
    imported local modules at their module level."""
    run = sorted((REPO / "tests").rglob("*.py"))
    run += [REPO / "scripts" / "run_tests.py", REPO / "scripts" / "bench-summary"]
    pending = [(p, False) for p in run]
    seen, found = set(), {}
    while pending:
        path, module_level = pending.pop()
        if (path, module_level) in seen or not path.is_file() or not is_python(path):
            continue
        seen.add((path, module_level))
        imports, scripts = scan(path, module_level)
        found.setdefault(path, []).extend(imports)
        pending += [(p, False) for p in scripts]
        pending += [(m, True) for m in (local_module(name) for name, _ in imports) if m]
    for name in SHELL_RUN:
        path = REPO / "scripts" / name
        for m in re.finditer(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", path.read_text(), re.M):
            found.setdefault(path, []).append((m.group(1), False))
    return found


def third_party(found):
    """{(file, module, optional)} of the imports that need a package."""
    out = set()
    for path, imports in found.items():
        for name, optional in imports:
            if (name in sys.stdlib_module_names or name == "__future__"
                    or local_module(name) or name == "conftest"):
                continue
            out.add((path, name, optional))
    return out


def undeclared():
    need = declared(REQ_TEST)
    anywhere = set(need)
    for p in (REPO / "scripts").glob("requirements-*.txt"):
        anywhere |= declared(p)
    missing = []
    for path, name, optional in sorted(third_party(executed_files())):
        pkg = PACKAGE_OF.get(name, name)
        if norm(pkg) in (anywhere if optional else need):
            continue
        where = "any scripts/requirements-*.txt" if optional else REQ_TEST.name
        missing.append(f"{path.relative_to(REPO)} imports {name} (package {pkg}), "
                       f"which {where} does not declare")
    return missing


def test_test_imports_are_declared():
    missing = undeclared()
    assert not missing, "\n".join(missing)


def test_the_scan_sees_what_it_should():
    """The check itself: it reads the scripts tests run and the modules they
    import, tells optional imports apart, and would name an undeclared one."""
    found = executed_files()
    names = {p.relative_to(REPO).as_posix() for p in found}
    assert {"scripts/run_tests.py", "scripts/bench-batching", "scripts/ref/numpy_llama.py",
            "clients/python/zinfer_client.py", "tests/e2e/test_http.py"} <= names, names
    imports = third_party(found)
    assert (REPO / "tests/e2e/test_http.py", "jinja2", False) in imports
    assert (REPO / "tests/e2e/test_embeddings.py", "llama_cpp", True) in imports
