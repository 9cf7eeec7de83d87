"""The docs say what the code does: the policy's fields and defaults and every environment variable
(docs/configuration.md), every command and option (docs/cli.md), and the one choice every page states (the
transactions default); docs/deploy.md quotes the cleanup's runtime limit as the code sets it, one figure for a cleanup
of 1,000 zombies, and a Secret holding every variable the pipeline reads. The README's first screen says what it is,
the two commands and where to go next; every link of the README and the docs leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest

from zombie_pipeline import config
from zombie_pipeline.app import cli
from zombie_pipeline.defs.cleanup.jobs import CLEANUP_MAX_RUNTIME_SECONDS
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.connections import DEFAULT_TIMEOUT_MS, EMBEDDED_TIMEOUT_MS
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
CLI = (REPO / "docs" / "cli.md").read_text()
#: How the table writes a field whose default is "none given": what then applies.
UNSET = {"queue_generation": "detected", "cache_generation": "detected", "enqueue_retries": "per generation"}


def section(title: str, page: str = CONFIGURATION) -> str:
    """The section of ``page`` under ``title``, to the next heading."""
    start = page.index(title)
    following = re.search(r"\n#{2,3} ", page[start + len(title) :])
    return page[start : start + len(title) + (following.start() if following else len(page))]


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the Markdown tables in ``text`` (header and rule left out)."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(line) <= set("|-: ") and cells[0] not in ("field", "variable", "option"):
            rows.append(cells)
    return rows


def written(name: str, value: object) -> str:
    """A default as the table writes it."""
    if value is None:
        return UNSET[name]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "`{}`" if not value else str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_policy_table_lists_every_field_of_the_policy_with_its_default():
    documented: dict[str, str] = {}
    for cells in table_rows(section("## Policy (`zombie_policy` resource)")):
        names = re.findall(r"`(\w+)`", cells[0])
        defaults = [default.strip() for default in cells[1].split(" / ")]
        assert len(names) == len(defaults), cells
        documented.update(zip(names, defaults, strict=True))

    fields = ZombiePolicy.model_fields
    assert set(documented) == set(fields)
    for name, info in fields.items():
        assert documented[name] == written(name, info.get_default(call_default_factory=True)), name


def test_every_environment_variable_the_pipeline_reads_is_in_the_readmes_table():
    variables = {value for name, value in vars(config).items() if name.endswith("_ENV") and isinstance(value, str)}
    documented = {re.sub(r"`", "", cells[0]) for cells in table_rows(section("## Pointing it at a real MongoDB"))}

    assert variables - documented == set()


COMMANDS = {"demo": [], "simulate": [], "workers": [], "db": ["status"], "status": [], "policy": ["check"]}


def test_the_docs_describe_every_command():
    assert set(COMMANDS) == set(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr,arg-type]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_and_each_of_its_options_is_in_the_docs_command_line(command):
    text = section("## Command line", CLI)
    parser = cli.build_parser().parse_args([command, *COMMANDS[command]]).command_parser
    options = {option for action in parser._actions for option in action.option_strings if option.startswith("--")}
    options -= {"--help"}

    synopsis = next(line for line in text.splitlines() if line.startswith(f"zombie-pipeline {command}"))
    assert {option for option in options if option not in synopsis} == set()
    if command != "db":
        described = re.split(r"\*\*`", text.split(f"**`{command}", 1)[1])[0]
        listed = {cells[0].strip("`") for cells in table_rows(described) if cells[0].startswith("`--")}
        assert listed == options


def test_every_page_says_transactions_are_off_by_default_as_the_policy():
    docs = Path(__file__).resolve().parents[1] / "docs"
    assert ZombiePolicy().transactions is False
    assert "By default (`transactions: false`)" in (docs / "generations.md").read_text()
    assert "### The `transactions` default: off" in (docs / "reliability.md").read_text()
    assert "Off (the default)" in (ZombiePolicy.model_fields["transactions"].description or "")


def test_the_docs_document_the_database_timeout_with_its_default():
    rows = {cells[0].strip("`"): cells[1] for cells in table_rows(section("## Pointing it at a real MongoDB"))}
    assert rows[config.MONGO_TIMEOUT_ENV] == f"`{DEFAULT_TIMEOUT_MS}`, `{EMBEDDED_TIMEOUT_MS}` on the embedded default"


def test_the_docs_give_the_exit_statuses_of_policy_check_as_the_code_defines_them():
    from zombie_pipeline.app.policy_check import Verdict

    rows = {cells[0] for cells in table_rows(CLI.split("**`policy check", 1)[1]) if cells[0].isdigit()}
    assert rows == {str(int(verdict)) for verdict in Verdict}


# --- the README's first screen, and the links ---------------------------------------------------------------------


def test_the_readmes_first_screen_says_what_it_is_the_two_commands_and_where_to_go_next():
    first_screen = README[: README.index("## Where to go next")]
    assert len(first_screen.splitlines()) <= 40
    assert "pip install -e '.[embedded]' && .venv/bin/zombie-pipeline demo" in first_screen
    assert "pip install -e '.[dev]' && .venv/bin/python -m pytest" in first_screen
    next_steps = re.findall(r"\]\((docs/[\w.-]+\.md)\)", README[README.index("## Where to go next") :])
    assert {"docs/cli.md", "docs/ui.md", "docs/configuration.md", "docs/deploy.md"} <= set(next_steps)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_link_of_a_page_leads_to_a_file_and_a_heading_that_exist(page):
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), (page.name, target)
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
            assert anchor in {slug(heading) for heading in headings}, (page.name, target)


# --- docs/deploy.md: the figures the code defines, quoted as it defines them ------------------------------------------

DEPLOY_DOCS = (REPO / "docs" / "deploy.md").read_text()
INSTANCE_FILE = (REPO / "deploy" / "dagster.yaml").read_text()


def one_line(text: str) -> str:
    """Markdown and YAML comments wrap lines: a figure and its unit may sit on two."""
    return " ".join(line.strip().lstrip("#").strip() for line in text.splitlines())


def test_the_deploy_docs_quote_one_runtime_limit_for_the_cleanup_the_one_the_code_sets():
    text = one_line(DEPLOY_DOCS)
    quoted = [int(minutes) * 60 for minutes in re.findall(r"(\d+)-minute `dagster/max_runtime`", text)]
    quoted += [int(seconds) for seconds in re.findall(r"(\d+) s `dagster/max_runtime`", text)]
    for minutes, seconds in re.findall(r"own `dagster/max_runtime` is (\d+) minutes \((\d+) s\)", text):
        quoted += [int(minutes) * 60, int(seconds)]
    assert len(quoted) >= 3 and set(quoted) == {CLEANUP_MAX_RUNTIME_SECONDS}, quoted


def test_the_deploy_docs_give_one_figure_for_a_cleanup_of_1000_zombies_and_the_headroom_it_leaves():
    texts = [one_line(DEPLOY_DOCS), one_line(INSTANCE_FILE)]
    figures = {
        float(seconds) for text in texts for seconds in re.findall(r"([\d.]+) s(?: of [a-z ]+)? for 1,000\b", text)
    }
    figures |= {float(seconds) for text in texts for seconds in re.findall(r"1,000 zombies takes ([\d.]+) s", text)}
    [figure] = figures
    ratios = {int(times) for times in re.findall(r"some (\d+) times (?:that|what)", one_line(DEPLOY_DOCS))}
    assert ratios == {round(CLEANUP_MAX_RUNTIME_SECONDS / figure)}, (figure, ratios)


def test_the_kubectl_secret_holds_every_variable_the_pipeline_reads_but_those_the_image_sets():
    command = DEPLOY_DOCS[DEPLOY_DOCS.index("kubectl -n datasets-server create secret generic zombie-pipeline-env") :]
    command = command[: command.index("\nkubectl")]
    in_secret = set(re.findall(r"--from-literal=(\w+)=", command))
    variables = {value for name, value in vars(config).items() if name.endswith("_ENV") and isinstance(value, str)}
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    set_by_the_image = {name for name in variables if re.search(rf"^\s+{name}=", dockerfile, re.MULTILINE)}

    assert set_by_the_image == {config.DAGSTER_HOME_ENV, config.HOME_ENV}
    assert in_secret == variables - set_by_the_image


UI = (REPO / "docs" / "ui.md").read_text()
#: docs/ui.md's list of what the code location holds, every subsection of it.
UI_CONTENTS = UI[UI.index("## What is there") : UI.index("## Screens")]


def test_the_ui_page_has_a_row_for_every_job_schedule_sensor_and_check_and_names_every_asset():
    from zombie_pipeline.definitions import defs

    listed = {cells[0].strip("`").split("` ")[0] for cells in table_rows(UI_CONTENTS)}
    defined = {job.name for job in defs.jobs or []}
    defined |= {schedule.name for schedule in defs.schedules or []}
    defined |= {sensor.name for sensor in defs.sensors or []}
    assets = set()
    for asset in defs.assets or []:
        assert isinstance(asset, dg.AssetsDefinition)
        assets |= {key.to_user_string() for key in asset.keys}
        defined |= {key.name for key in asset.check_keys}
    for checks in defs.asset_checks or []:
        defined |= {key.name for key in checks.check_keys}

    assert defined - listed == set()
    assert {name for name in assets if f"`{name}`" not in UI_CONTENTS} == set()


def test_the_generations_page_has_a_row_per_generation_citing_the_commit_its_finish_was_read_from():
    page = (Path(__file__).resolve().parents[1] / "docs" / "generations.md").read_text()
    table = page.split("### What each generation's finish does with failed runs, versions and owned locks", 1)[1]
    first_table = table[table.index("\n|") : table.index("\n\n", table.index("\n|"))]
    rows = {cells[0].strip("`"): cells[1] for cells in table_rows(first_table)[1:]}  # the header left out
    assert set(rows) == set(QUEUE_GENERATIONS)
    for name, generation in QUEUE_GENERATIONS.items():
        assert len(generation.read_from) == 40
        assert rows[name].startswith(generation.read_from[:9]), name
