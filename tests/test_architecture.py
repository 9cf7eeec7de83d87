"""docs/architecture.md tells the tree as it is, and the core stays apart from Dagster and the simulator: every
module of ``zombie_pipeline`` is on the page's tree and every module the tree names exists; no module of the core
imports Dagster or ``zombie_pipeline.defs``, and none of the queue, the cleanup, the statistics, the policy or the
configuration imports ``zombie_pipeline.simulation``, and no module of the simulation imports the cleanup's
bookkeeping (effects, side collections, counters); and no module imports itself back through others, read from each
module's imports (ast), not from running it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "zombie_pipeline"
PAGE = (REPO / "docs" / "architecture.md").read_text()
#: The wiring and the entry points: the only places that may import Dagster.
NOT_CORE = ("defs/", "definitions.py", "app/")
#: The domain's rules, which must work the same on a deployment's databases as on a simulated one.
KNOWS_NO_SIMULATOR = ("queue/", "cleanup/", "statistics/", "policy.py", "config.py")
SIMULATION = "zombie_pipeline.simulation"
#: The simulated deployment books its jobs and counters through a model of the deployment's own writes
#: (``simulation/deployment_writes.py``), never through the cleanup's bookkeeping: a bug there would be made by both
#: sides and seen by neither. (``simulation/history.py`` runs the cleanup's finalizer, which uses it: past cleanups.)
CLEANUP_BOOKKEEPING = tuple(f"zombie_pipeline.cleanup.{name}" for name in ("effects", "side_collections", "counters"))


def modules_on_disk() -> set[str]:
    """Every module of the package, as a path under ``zombie_pipeline/`` (``__init__.py`` left out: the package is)."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def modules_on_page(page: str) -> set[str]:
    """The modules the page's tree names: its entries indented two spaces a level, a directory ending in ``/``."""
    tree = re.search(r"## The tree\n+```text\n(.*?)```", page, re.DOTALL)
    assert tree is not None, "docs/architecture.md has no '## The tree' section with a ```text block"
    lines = tree.group(1).splitlines()
    assert lines[0] == "zombie_pipeline/", lines[0]
    parents: list[str] = []
    modules: set[str] = set()
    for line in lines[1:]:
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent >= 2, f"an entry indented by {indent} spaces: {line!r}"
        depth = indent // 2 - 1
        assert depth <= len(parents), f"an entry deeper than its directory: {line!r}"
        del parents[depth:]
        entry = line.split()[0]
        if entry.endswith("/"):
            parents.append(entry)
        else:
            modules.add("".join(parents) + entry)
    return modules


def imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports, whatever the place of the import (top level, a function, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def is_core(module: str) -> bool:
    return not module.startswith(NOT_CORE)


def forbidden(name: str) -> bool:
    """Dagster and its libraries (``dagster_prometheus``, ``dagster_shared``), or the wiring."""
    return (
        name.split(".")[0].startswith("dagster")
        or name == "zombie_pipeline.defs"
        or name.startswith("zombie_pipeline.defs.")
    )


def test_every_module_of_the_package_is_on_the_pages_tree_and_every_module_it_names_exists():
    on_disk, on_page = modules_on_disk(), modules_on_page(PAGE)
    assert not on_disk - on_page, f"modules missing from docs/architecture.md: {sorted(on_disk - on_page)}"
    assert not on_page - on_disk, f"modules docs/architecture.md names that do not exist: {sorted(on_page - on_disk)}"


def test_the_tree_is_read_as_paths():
    tree = (
        "## The tree\n\n```text\nzombie_pipeline/\n  config.py  x\n  queue/\n    store.py  y\n  app/\n    cli.py\n```\n"
    )
    assert modules_on_page(tree) == {"config.py", "queue/store.py", "app/cli.py"}


CORE_MODULES = sorted(module for module in modules_on_disk() if is_core(module))


def test_the_core_is_most_of_the_package():
    assert {"queue/jobs.py", "cleanup/finalizer.py", "statistics/tallies.py", "policy.py"} <= set(CORE_MODULES)
    assert "observability/metrics.py" in CORE_MODULES and "defs/resources.py" not in CORE_MODULES


@pytest.mark.parametrize("module", CORE_MODULES)
def test_no_core_module_imports_dagster_or_the_wiring(module):
    imports = imported_modules(PACKAGE / module)
    assert not sorted(filter(forbidden, imports)), f"{module} imports {sorted(filter(forbidden, imports))}"


SIMULATOR_FREE_MODULES = sorted(module for module in modules_on_disk() if module.startswith(KNOWS_NO_SIMULATOR))


def imports_the_simulator(name: str) -> bool:
    return name == SIMULATION or name.startswith(f"{SIMULATION}.")


def test_the_modules_that_must_not_know_the_simulator_are_the_queue_the_cleanup_the_statistics_and_the_rules():
    assert {"queue/store.py", "queue/embedded.py", "cleanup/finalizer.py", "statistics/sources.py"} <= set(
        SIMULATOR_FREE_MODULES
    )
    assert {"policy.py", "config.py"} <= set(SIMULATOR_FREE_MODULES)
    assert "simulation/marks.py" not in SIMULATOR_FREE_MODULES


@pytest.mark.parametrize("module", SIMULATOR_FREE_MODULES)
def test_no_module_of_the_queue_the_cleanup_or_the_statistics_imports_the_simulator(module):
    imports = imported_modules(PACKAGE / module)
    assert not sorted(filter(imports_the_simulator, imports)), (
        f"{module} imports {sorted(filter(imports_the_simulator, imports))}"
    )


def test_the_import_check_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import dagster as dg\n"
        "if TYPE_CHECKING:\n    from zombie_pipeline.defs.resources import Databases\n"
        "def later():\n    from zombie_pipeline import defs\n"
    )
    imports = imported_modules(source)
    assert {"dagster", "zombie_pipeline.defs.resources", "zombie_pipeline.defs"} <= set(filter(forbidden, imports))
    source.write_text(
        "def later():\n    from zombie_pipeline import simulation\n    from zombie_pipeline.simulation.marks import marks\n"
    )
    assert {"zombie_pipeline.simulation", "zombie_pipeline.simulation.marks"} <= set(
        filter(imports_the_simulator, imported_modules(source))
    )
    assert not imports_the_simulator("zombie_pipeline.simulationist")
    assert not forbidden("typing.TYPE_CHECKING") and not forbidden("zombie_pipeline.definitions")


SIMULATION_MODULES = sorted(module for module in modules_on_disk() if module.startswith("simulation/"))


def test_the_simulation_modules_include_the_workers_and_their_model():
    assert {"simulation/workers.py", "simulation/deployment_writes.py", "simulation/simulator.py"} <= set(
        SIMULATION_MODULES
    )


@pytest.mark.parametrize("module", SIMULATION_MODULES)
def test_the_simulated_deployment_does_not_book_its_jobs_with_the_cleanups_bookkeeping(module):
    imports = imported_modules(PACKAGE / module)
    assert not sorted(imports & set(CLEANUP_BOOKKEEPING)), (
        f"{module} imports {sorted(imports & set(CLEANUP_BOOKKEEPING))}"
    )


def test_the_bookkeeping_check_sees_a_module_imported_from_its_package(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("from zombie_pipeline.cleanup import counters\n")
    assert imported_modules(source) & set(CLEANUP_BOOKKEEPING) == {"zombie_pipeline.cleanup.counters"}


def dotted(module: str) -> str:
    """``cleanup/run.py`` as Python names it: ``zombie_pipeline.cleanup.run`` (a package by its directory)."""
    return "zombie_pipeline." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def loaded_at_import(path: Path, known: set[str]) -> set[str]:
    """The package's modules that importing ``path`` imports first: its top-level imports, not those inside a function
    or an ``if`` (``TYPE_CHECKING``); ``from package import module`` names the module, not the package."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found.update(submodules or ({node.module} & known))
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm): each one a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def package_graph() -> dict[str, set[str]]:
    paths = {dotted(path.relative_to(PACKAGE).as_posix()): path for path in PACKAGE.rglob("*.py")}
    paths[PACKAGE.name] = paths.pop(dotted("__init__.py"))
    return {name: loaded_at_import(path, set(paths)) - {name} for name, path in paths.items()}


def test_no_module_of_the_package_imports_itself_back_through_others():
    """A cycle works only in the order that happens to import it first; a type-only reference (``TYPE_CHECKING``)
    or an import inside a function is not one."""
    graph = package_graph()
    assert {"zombie_pipeline.cleanup.run", "zombie_pipeline.defs.health"} <= set(graph)
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
