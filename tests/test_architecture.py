"""The package's structure: one-way imports, no import circle, the HTTP client free of JAX, small files."""
import ast
import os
import subprocess
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "replug_jax")
MAX_LINES = 300


def modules() -> dict[str, str]:
    """{module name: path} of every module in the package."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def imports(path: str, known: set[str]) -> set[str]:
    """Package modules `path` imports anywhere (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found |= {n for n in names if n in known}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, known) - {m, "replug_jax"} for m, p in mods.items()}


def test_train_does_not_import_evaluate():
    for module, deps in graph().items():
        if module.startswith("replug_jax.train"):
            assert not {d for d in deps if d.startswith("replug_jax.evaluate")}, f"{module} imports {deps}"


def test_no_import_circle():
    g = graph()
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_http_client_does_not_import_jax():
    code = "import sys, replug_jax.lm.http, replug_jax.lm.http_probe; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(PACKAGE))


def test_modules_stay_small():
    long = {m: n for m, p in modules().items() if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
