"""The package's structure: the import contract (.importlinter, layers and jobs), the HTTP client free of JAX, the
root kept to the entry points, every module named in docs/architecture.md."""
import ast
import os
import re
import shutil
import subprocess
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "replug_jax")


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


ROOT = os.path.dirname(PACKAGE)
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")
ROOT_MODULES = {"__init__", "main", "serve", "launch", "api", "replug"}  # the entry points and the public API (the
# loaders are a layer's folder of their own, loading/, below the jobs)
ALARM_LINES = 600  # not a cap to cut by: a module this long probably holds two concepts


def lint_imports(cwd: str) -> subprocess.CompletedProcess:
    """import-linter's `lint-imports` over the package at `cwd` (its contracts: .importlinter)."""
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True)


def test_the_import_contract_holds():
    """.importlinter: the layers (every import points down, at module level or inside a function), the jobs'
    own order (no job imports another) and the HTTP client free of JAX."""
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "broken" in run.stdout and " 0 broken" in run.stdout, run.stdout


def test_the_contract_refuses_an_upward_import_even_inside_a_function(tmp_path):
    """The contract catches what it guards: the package copied with one upward import added (the method's math
    reaching up into the jobs, inside a function) and one job importing another."""
    shutil.copytree(PACKAGE, tmp_path / "replug_jax", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, ".importlinter"), tmp_path / ".importlinter")
    with open(tmp_path / "replug_jax" / "method" / "mixture.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _upward():\n    from replug_jax.jobs import prepare  # noqa: F401\n")
    with open(tmp_path / "replug_jax" / "jobs" / "lm_eval.py", "a", encoding="utf-8") as f:
        f.write("\n\nfrom replug_jax.jobs import downstream  # noqa: E402, F401\n")
    run = lint_imports(str(tmp_path))
    assert run.returncode != 0
    assert "replug_jax.method.mixture -> replug_jax.jobs.prepare" in run.stdout, run.stdout
    assert "replug_jax.jobs.lm_eval -> replug_jax.jobs.downstream" in run.stdout, run.stdout


def root_importers(package_dir: str) -> set[str]:
    """The package's modules that import the package root itself (`import replug_jax`), in grimp's graph (what
    import-linter reads): through the root's lazy `rj.*` names such a module reaches any layer unseen."""
    code = ("import grimp, sys; g = grimp.build_graph('replug_jax', cache_dir=None); "
            "print('\\n'.join(sorted(g.find_modules_that_directly_import('replug_jax'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=package_dir, capture_output=True, text=True, check=True)
    return set(run.stdout.split())


def test_no_module_of_the_package_imports_the_package_root(tmp_path):
    """Issue 70's contract made true: every module imports what it uses by name (the loaders from
    replug_jax.loading, the version from replug_jax.base.version), so import-linter sees every arrow. The check
    catches what it guards: a copy of the package with one `import replug_jax as rj` added fails it."""
    assert root_importers(ROOT) == set()
    shutil.copytree(PACKAGE, tmp_path / "replug_jax", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "replug_jax" / "jobs" / "prepare.py", "a", encoding="utf-8") as f:
        f.write("\n\nimport replug_jax as rj  # noqa: E402, F401\n")
    assert root_importers(str(tmp_path)) == {"replug_jax.jobs.prepare"}


def test_the_http_client_does_not_import_jax():
    code = "import sys, replug_jax.lm.http; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_root_holds_the_entry_points_and_the_public_api_alone():
    names = {f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")}
    assert names == ROOT_MODULES, f"modules at the package root: {sorted(names)}; give each a layer's folder"


def test_every_layer_says_what_it_holds_and_what_it_may_import():
    """Each package folder's __init__ docstring names its layer's imports (docs/architecture.md draws them)."""
    import ast as ast_

    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if root == PACKAGE or os.path.basename(root) == "http":
            continue
        doc = ast_.get_docstring(ast_.parse(open(os.path.join(root, "__init__.py"), encoding="utf-8").read()))
        assert doc and ("Layer:" in doc), f"{os.path.relpath(root, ROOT)}/__init__.py: no 'Layer:' line in {doc!r}"
    layers = open(os.path.join(ROOT, ".importlinter"), encoding="utf-8").read()
    for name in sorted(os.listdir(PACKAGE)):
        if os.path.isdir(os.path.join(PACKAGE, name)) and name != "__pycache__":
            assert re.search(rf"^\s+(.*\| )?{name}( \|.*)?$", layers, flags=re.M), f"{name} is in no layer"


def test_no_module_is_long_enough_to_hold_two_concepts():
    long = {m: n for m, p in modules().items() if (n := sum(1 for _ in open(p, encoding="utf-8"))) > ALARM_LINES}
    assert not long, f"modules over {ALARM_LINES} lines (split by concept, not by count): {long}"


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


def test_every_job_is_in_the_contracts_independent_layer():
    """A new job joins the jobs contract's `lm_eval | lsr | downstream` line, so it may import no other job."""
    layers = open(os.path.join(ROOT, ".importlinter"), encoding="utf-8").read()
    line = next(ln for ln in layers.splitlines() if "lm_eval |" in ln)
    independent = {"replug_jax.jobs." + n.strip() for n in line.split("|")}
    assert job_modules() == independent


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


def test_the_architecture_page_names_every_module():
    page = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    missing = [p for p in modules().values()
               if os.path.basename(p) != "__init__.py" and os.path.relpath(p, PACKAGE) not in page]
    assert not missing, f"docs/architecture.md does not name {sorted(os.path.relpath(p, ROOT) for p in missing)}"
    assert "(docs/architecture.md)" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def private_library_imports(path: str) -> list[str]:
    """Imports of a library's private modules (jax._src, flax.linen._..., ...) in one file."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [n for n in names if not n.startswith("replug_jax")
                  and any(p.startswith("_") and not p.endswith("__") for p in n.split(".")[1:])]
    return found


def test_no_module_imports_a_librarys_private_modules(tmp_path):
    """jax._src and its kind change without notice between releases: the package uses public APIs only."""
    used = {m: found for m, p in modules().items() if (found := private_library_imports(p))}
    assert not used, f"private library modules imported: {used}"
    probe = tmp_path / "probe.py"  # the check catches both forms
    probe.write_text("from jax._src import config\nimport jax._src.core as core\nimport jax.numpy\n")
    assert private_library_imports(str(probe)) == ["jax._src", "jax._src.core"]
