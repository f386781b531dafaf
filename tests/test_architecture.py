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


def test_data_does_not_reach_up_into_evaluation_training_or_jobs():
    """Data readers sit below what consumes them (answer normalisation lives in replug_jax/answers.py for both)."""
    upper = ("replug_jax.evaluate", "replug_jax.train", "replug_jax.jobs")
    for module, deps in graph().items():
        if module.startswith("replug_jax.data"):
            assert not {d for d in deps if d.startswith(upper)}, f"{module} imports {sorted(deps)}"


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


def private_uses(path: str, known: set[str]) -> list[str]:
    """`from replug_jax.x import _name` and `x._name` where x is a replug_jax module bound by an import."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in known})
        elif isinstance(node, ast.ImportFrom) and node.module in known:
            for a in node.names:
                if a.name.startswith("_"):
                    found.append(f"from {node.module} import {a.name}")
                elif f"{node.module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names(tmp_path):
    known = set(modules())
    used = {m: found for m, p in modules().items() if (found := private_uses(p, known))}
    assert not used, f"private names used across modules: {used}"
    probe = tmp_path / "probe.py"  # the check itself catches both forms
    probe.write_text("from replug_jax.models import weights as w\nfrom replug_jax.lm.local import _x\nw._take(1)\n")
    assert private_uses(str(probe), known) == ["from replug_jax.lm.local import _x", "replug_jax.models.weights._take"]


def job_modules() -> set[str]:
    """The jobs: modules of replug_jax.jobs that define a `run_...` function."""
    found = set()
    for m, p in modules().items():
        if m.startswith("replug_jax.jobs."):
            tree = ast.parse(open(p, encoding="utf-8").read())
            if any(isinstance(n, ast.FunctionDef) and n.name.startswith("run_") for n in tree.body):
                found.add(m)
    return found


def test_no_job_imports_another_job():
    """What jobs share lives in modules that are not jobs (replug_jax.workspace, jobs/window_report.py)."""
    jobs = job_modules()
    assert {"replug_jax.jobs.lm_eval", "replug_jax.jobs.lsr", "replug_jax.jobs.downstream"} <= jobs
    g = graph()
    for job in jobs:
        assert not (g[job] & jobs) - {job}, f"{job} imports the jobs {sorted((g[job] & jobs) - {job})}"
    for module, deps in g.items():  # nor does the rest of the package, but for the dispatcher
        if module not in jobs and module != "replug_jax.dispatch":
            assert not deps & jobs, f"{module} imports the jobs {sorted(deps & jobs)}"


def test_every_test_the_readmes_name_exists():
    """README claims point at tests that exist: each tests/FILE.py[::TEST] and each test_NAME they mention."""
    import re

    root = os.path.dirname(PACKAGE)
    files = {f[:-3] for f in os.listdir(os.path.join(root, "tests")) if f.endswith(".py")}
    functions = {m for f in files for m in re.findall(r"^def (test_\w+)", open(os.path.join(root, "tests", f + ".py"),
                                                                              encoding="utf-8").read(), flags=re.M)}
    for readme in ("README.md", "experiments/README.md", "benchmarks/README.md", "tests/README.md",
                   *sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")))):
        text = open(os.path.join(root, readme), encoding="utf-8").read()
        for name in set(re.findall(r"(?<![\w:])(test_\w+)", text)):  # not OLMES forms (olmes:arc_easy:test_rc_5shot)
            assert name in files or name in functions, f"{readme} names {name}, which no test file or test is"
        for path, test in re.findall(r"tests/(\w+)\.py(?:::(\w+))?", text):
            assert path in files and (not test or test in functions), f"{readme} names tests/{path}.py::{test}"


def test_the_readme_layout_names_every_module():
    root = os.path.dirname(PACKAGE)
    layout = open(os.path.join(root, "docs", "layout.md"), encoding="utf-8").read()
    missing = [p for p in modules().values() if os.path.basename(p) not in layout]
    assert not missing, f"docs/layout.md does not name {sorted(os.path.relpath(p, root) for p in missing)}"
    assert "(docs/layout.md)" in open(os.path.join(root, "README.md"), encoding="utf-8").read()
