"""Put Dagster's official Helm chart, at the project's Dagster version, where tests/deploy/test_helm_chart.py reads it.

No file of the chart is kept in this repository: this copies ``helm/dagster`` (with its in-tree subchart
``dagster-user-deployments``) into a cache folder, from whichever of these an operator has:

    python scripts/dagster_chart.py setup --git-dir PATH/TO/dagster.git     # a clone or bare mirror of dagster-io/dagster
    python scripts/dagster_chart.py setup --archive dagster-1.13.27.tgz     # `helm pull dagster/dagster --version 1.13.27`
    python scripts/dagster_chart.py setup --directory PATH/TO/dagster       # the same, unpacked (`--untar`)
    python scripts/dagster_chart.py status

From git, the chart is taken at the release tag of the version (``1.13.27``; ``--ref`` for another). The chart's
own ``Chart.yaml`` must say that version: a chart of another one is refused, unless ``--allow-other-version``
(the test then says which version it checked). The test renders the chart with Helm's own engine through the
``helm-python-sdk`` package: ``pip install -e '.[chart]'``.

Layout: ``$ZOMBIE_DAGSTER_CHART_CACHE/<version>/`` (default ``.cache/dagster-chart/<version>/`` in this
repository) holds ``chart/`` and ``manifest.json`` (where the chart came from; written last: its presence means
ready).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CACHE_ENV = "ZOMBIE_DAGSTER_CHART_CACHE"
CHART_PATH = "helm/dagster"
MANIFEST = "manifest.json"


class SetupError(RuntimeError):
    pass


def pinned_version() -> str:
    """The Dagster version of pyproject.toml: the chart is released with the same number."""
    requirement: str
    for requirement in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, _, version = requirement.partition("==")
        if name.strip() == "dagster" and version:
            return version.strip()
    raise SetupError("pyproject.toml pins no dagster version")


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).resolve() if configured else REPO / ".cache" / "dagster-chart"


def version_dir(version: str) -> Path:
    return cache_root() / version


def log(message: str) -> None:
    print(f"[dagster_chart] {message}", flush=True)


def _extract(archive: bytes, prefix: str, destination: Path) -> None:
    """The members under ``prefix`` of a tar archive into ``destination``, without the prefix."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.name != prefix.rstrip("/"):
                member.name = member.name[len(prefix) :]
                members.append(member)
        if not members:
            raise SetupError(f"nothing under {prefix!r} in the archive")
        tar.extractall(destination, members=members, filter="data")


def from_git(git_dir: Path, ref: str, destination: Path) -> dict[str, str]:
    if (git_dir / ".git").exists():
        git_dir = git_dir / ".git"

    def git(*args: str) -> bytes:
        done = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True)
        if done.returncode != 0:
            raise SetupError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    sha = git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    _extract(git("archive", "--format=tar", sha, CHART_PATH), CHART_PATH + "/", destination)
    return {"source": f"git {git_dir} {ref}", "commit": sha}


def from_archive(archive: Path, destination: Path) -> dict[str, str]:
    data = archive.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        top = {member.name.split("/", 1)[0] for member in tar.getmembers()}
    if len(top) != 1:
        raise SetupError(f"{archive} is not a chart package (one top folder expected, found {sorted(top)})")
    _extract(data, f"{top.pop()}/", destination)
    return {"source": f"archive {archive.resolve()}"}


def from_directory(directory: Path, destination: Path) -> dict[str, str]:
    shutil.copytree(directory, destination)
    return {"source": f"directory {directory.resolve()}"}


def setup(options: argparse.Namespace) -> dict[str, Any]:
    version = pinned_version()
    directory = version_dir(version)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    chart = directory / "chart"
    if options.git_dir:
        origin = from_git(options.git_dir, options.ref or version, chart)
    elif options.archive:
        origin = from_archive(options.archive, chart)
    else:
        origin = from_directory(options.directory, chart)
    if not (chart / "Chart.yaml").exists() or not (chart / "templates" / "configmap-instance.yaml").exists():
        shutil.rmtree(directory)
        raise SetupError(f"{chart} is not Dagster's chart (no Chart.yaml or templates/configmap-instance.yaml)")
    metadata = yaml.safe_load((chart / "Chart.yaml").read_text())
    chart_version = str(metadata.get("version"))
    if chart_version != version and not options.allow_other_version:
        shutil.rmtree(directory)
        raise SetupError(
            f"the chart says version {chart_version}, the project's Dagster is {version}: take the chart of {version} "
            "(or pass --allow-other-version to check against this one anyway)"
        )
    manifest = {
        "pinned_version": version,
        "chart_version": chart_version,
        "app_version": str(metadata.get("appVersion")),
        **origin,
        "created_at": datetime.now(UTC).isoformat(),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"chart {chart_version} (pinned {version}) from {origin['source']} in {chart}")
    return manifest


def status() -> int:
    version = pinned_version()
    path = version_dir(version) / MANIFEST
    if path.exists():
        manifest = json.loads(path.read_text())
        print(f"{version}: ready, chart {manifest['chart_version']} from {manifest['source']} ({version_dir(version)})")
    else:
        print(f"{version}: not set up ({version_dir(version)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("setup", help="copy the chart into the cache folder")
    source = make.add_mutually_exclusive_group(required=True)
    source.add_argument("--git-dir", type=Path, help="a clone or bare mirror of dagster-io/dagster")
    source.add_argument(
        "--archive", type=Path, help="the chart package (.tgz) of `helm pull dagster/dagster --version V`"
    )
    source.add_argument("--directory", type=Path, help="the chart, unpacked")
    make.add_argument("--ref", help="with --git-dir: the tag or commit (default: the pinned version's tag)")
    make.add_argument(
        "--allow-other-version", action="store_true", help="keep a chart whose Chart.yaml says another version"
    )
    commands.add_parser("status", help="what is set up, where")
    options = parser.parse_args(argv)
    if options.command == "status":
        return status()
    try:
        setup(options)
    except SetupError as error:
        print(f"[dagster_chart] error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
