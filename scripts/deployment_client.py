"""Set up the deployment's real client (dataset-viewer's ``libs/libcommon``) for the compatibility tests.

The tests in ``tests/test_deployment_*.py`` drive the deployment's own ``libcommon`` at pinned
commits of huggingface/dataset-viewer (formerly datasets-server). No code of that project is kept
in this repository: this script extracts ``libs/libcommon`` at a commit, either from an archive of
it (``libcommon-<commit>.tar.gz``, made by ``git archive <commit> libs/libcommon``, as the machine's
shared folder holds them) or from a git directory of the project (a clone or a bare mirror), into a
cache folder, makes a dedicated virtualenv there and pip-installs libcommon with the dependencies its
modules import, pinned to the versions of that commit's ``poetry.lock``.

    python scripts/deployment_client.py setup --all                 # every pinned label, from the archives
    python scripts/deployment_client.py setup --label 2023-12       # one label, from its archive
    python scripts/deployment_client.py setup --label current --git-dir PATH/TO/dataset-viewer.git
    python scripts/deployment_client.py status

Archives are looked for in ``$ZOMBIE_DEPLOYMENT_ARCHIVES`` (a folder), else ``../shared/dataset-viewer``
beside the repository, else ``/work/shared/dataset-viewer``.

Layout: ``$ZOMBIE_DEPLOYMENT_CACHE/<label>/`` (default ``~/.cache/zombie-pipeline/deployment/<label>/``,
shared by every clone of the repository) holds ``source/`` (``libs/libcommon`` at the commit), ``venv/``,
``requirements.txt`` (what was pinned) and ``deployment.json`` (the manifest, written last: its presence
means ready). An era set up with other requirements than the script now pins is set up again. Where the package
registry does not provide an era's pins, ``deployment-failure.json`` records why, the other eras are set up all the
same, and that era's tests skip saying so; any other failure exits non-zero (and its tests fail under CI).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE_ENV = "ZOMBIE_DEPLOYMENT_CACHE"
ARCHIVES_ENV = "ZOMBIE_DEPLOYMENT_ARCHIVES"
ARCHIVE_FOLDERS = (REPO.parent / "shared" / "dataset-viewer", Path("/work/shared/dataset-viewer"))
DRIVER = REPO / "tests" / "deployment_client" / "driver.py"
LIBCOMMON_PATH = "libs/libcommon"
MANIFEST = "deployment.json"

# The pinned commits. ``--commit`` sets up any other one under any label.
KNOWN_LABELS: dict[str, dict[str, str]] = {
    "current": {
        "commit": "f62009e0555b1274e7f6ddc7058dc796993f28b6",
        "why": "main in 2026-08 (f62009e05): finished jobs are deleted; locks, pastJobs, datasetBlockages, "
        "jobTotalMetric, workerTypeJobCounts, cacheTotalMetric; terminated_at",
    },
    "2023": {
        "commit": "28d339e40889d091fd5c34796fd0eee37e55ecbf",
        "why": "2023-03-23 'Kill long jobs (#977)': jobs kept after they finish (success/error/cancelled/"
        "skipped, finished_at, 7-day TTL), last_heartbeat, the deployment's own get_zombies/kill_zombies/"
        "kill_long_job; cache entries with job_runner_version, dataset_git_revision, progress",
    },
    "2023-07": {
        "commit": "d73fafbeb2a0a8848a30c038110820319e6a531f",
        "why": "2023-10-16: jobs kept, difficulty, locks freed on finish (those the job owns), jobTotalMetric "
        "and cacheTotalMetric",
    },
    "2023-12": {
        "commit": "436f33a6ad6933f3d7b3ba50e7f820832cf62950",
        "why": "2024-03-29: finished jobs deleted, workerTypeJobCounts, cache failed_runs",
    },
    "2024-06": {
        "commit": "c0e223c3886c1988d0eb5d856bd380347c9e0dea",
        "why": "2024-09-20: pastJobs, datasetBlockages, cache duration",
    },
}

# Distributions that the modules the tests use import (libcommon/__init__, queue, simple_cache,
# resources, constants, dtos, utils and what they import), at one commit or another. A name is
# installed when the commit's pyproject declares it or its poetry.lock holds it (another dependency
# needs it: numpy under pandas must be the version pandas was built against), pinned to the lock.
NEEDED = (
    "mongoengine",
    "pymongo",
    "pytz",
    "orjson",
    "huggingface-hub",
    "requests",
    "appdirs",
    "pandas",
    "numpy",
    "pyarrow",
    "pymongoarrow",
    "datasets",
    "fsspec",
    # each era's backfill rule (libcommon.state.CacheState) builds the processing graph with it
    "networkx",
    # and imports its profiler (libcommon.prometheus) and the configuration (libcommon.config), as its
    # orchestrator (the worker's own finish of a crashed job) does
    "prometheus-client",
    "psutil",
    "environs",
    "s3fs",  # the orchestrator's storage client, from 2024 (with cryptography for its URL signer)
    "cryptography",
    "pillow",  # and its assets (images, audio)
    "pydub",
)
# Imported too, but only reached through another dependency: pinned when the lock has them.
NEEDED_IF_LOCKED = ("python-dateutil", "dnspython", "marshmallow", "python-dotenv", "aiobotocore", "botocore", "cffi")
# The modules that must import wherever the commit has them: the tests drive them, and a test never falls back.
MUST_IMPORT = ("libcommon.state",)
FAILURE = "deployment-failure.json"


class SetupError(RuntimeError):
    pass


class RegistryError(SetupError):
    """The package registry did not provide the era's pins: recorded, so that its tests skip saying so."""


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).resolve()
    # the machine's cache, shared by every clone of the repository (CI's included): a set-up era is reused
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zombie-pipeline" / "deployment"


def label_dir(label: str) -> Path:
    return cache_root() / label


def venv_python(directory: Path) -> Path:
    return directory / "venv" / "bin" / "python"


def log(message: str) -> None:
    print(f"[deployment_client] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# git


def resolve_git_dir(path: Path) -> Path:
    if (path / ".git").exists():
        path = path / ".git"
    if not (path / "HEAD").exists() or not (path / "objects").exists():
        raise SetupError(f"{path} is not a git directory (a clone or a bare mirror of dataset-viewer)")
    return path


def git(git_dir: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True)
    if done.returncode != 0:
        raise SetupError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def resolve_commit(git_dir: Path, commit: str) -> dict[str, str]:
    sha = git(git_dir, "rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
    date, subject = git(git_dir, "log", "-1", "--format=%cI%x00%s", sha).decode().strip().split("\x00", 1)
    return {"commit": sha, "date": date, "subject": subject}


def archive_folders() -> list[Path]:
    configured = os.environ.get(ARCHIVES_ENV)
    return [Path(configured)] if configured else list(ARCHIVE_FOLDERS)


def find_archive(commit: str) -> Path:
    """The archive ``libcommon-<commit>.tar.gz`` of a full commit id, from the first folder holding it."""
    for folder in archive_folders():
        path = folder / f"libcommon-{commit}.tar.gz"
        if path.exists():
            return path
    raise SetupError(
        f"no archive libcommon-{commit}.tar.gz in {', '.join(map(str, archive_folders()))}: "
        f"set {ARCHIVES_ENV} to the folder holding it, or give --git-dir"
    )


def archive_commit(archive: bytes) -> str | None:
    """The commit ``git archive`` wrote into the tar's global header (``git get-tar-commit-id``)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        first = tar.next()
        return tar.pax_headers.get("comment") if first is not None else None


def extract_libcommon(archive: bytes, destination: Path) -> None:
    """``libs/libcommon`` of a tar into ``destination`` (without the libs/libcommon prefix)."""
    prefix = LIBCOMMON_PATH + "/"
    destination.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(prefix):
                continue
            member.name = member.name[len(prefix) :]
            members.append(member)
        tar.extractall(destination, members=members, filter="data")
    if not (destination / "pyproject.toml").exists():
        raise SetupError(f"{LIBCOMMON_PATH}/pyproject.toml not found in the archive")


# ---------------------------------------------------------------------------------------------
# requirements from the commit's own pyproject and lock


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def declared_dependencies(pyproject: dict[str, Any]) -> tuple[set[str], str | None]:
    poetry = pyproject.get("tool", {}).get("poetry", {})
    if "dependencies" in poetry:
        dependencies = poetry["dependencies"]
        python = dependencies.get("python")
        return {canonical(name) for name in dependencies if name != "python"}, python
    project = pyproject.get("project", {})
    names = set()
    for requirement in project.get("dependencies", []):
        name = requirement.split(";")[0]
        for separator in "<>=!~[ (@":
            name = name.split(separator)[0]
        names.add(canonical(name))
    return names, project.get("requires-python")


def locked_versions(lock: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {canonical(package["name"]): package for package in lock.get("package", [])}


def pinned_requirements(source: Path, extra: list[str]) -> tuple[list[str], list[dict[str, Any]], str | None]:
    """The requirement lines to install, the deviations from the lock (with reasons), python."""
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    declared, python = declared_dependencies(pyproject)
    lock_path = source / "poetry.lock"
    locked = locked_versions(tomllib.loads(lock_path.read_text())) if lock_path.exists() else {}
    deviations: list[dict[str, Any]] = []
    requirements: dict[str, str] = {}
    for name in NEEDED + NEEDED_IF_LOCKED:
        package = locked.get(name)
        if name in NEEDED and name not in declared and package is None:
            continue
        if package is None:
            if name in NEEDED:
                requirements[name] = name
                deviations.append({"package": name, "installed": "newest", "reason": "not in poetry.lock"})
            continue
        version = package["version"]
        source_type = package.get("source", {}).get("type")
        if source_type in ("git", "url", "directory", "file"):
            # a git revision is not on PyPI: the release it was developed towards
            release = version.split(".dev")[0].split("+")[0]
            deviations.append(
                {
                    "package": name,
                    "locked": f"{version} ({source_type} {package['source'].get('url', '')}"
                    f"@{package['source'].get('resolved_reference', package['source'].get('reference', ''))})",
                    "installed": release,
                    "reason": "the lock takes it from git; the nearest PyPI release is installed",
                }
            )
            version = release
        requirements[name] = f"{name}=={version}"
    for line in extra:
        name = canonical(line.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip())
        if name in requirements:
            deviations.append({"package": name, "locked": requirements[name], "installed": line, "reason": "--extra"})
        requirements[name] = line
    return sorted(requirements.values()), deviations, python


# ---------------------------------------------------------------------------------------------
# setup


def run(command: list[str], what: str, error: type[SetupError] = SetupError) -> None:
    log(f"{what}: {' '.join(command)}")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise error(f"{what} failed:\n{tail}")


def directory_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = Path(root) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def libcommon_at(git_dir: Path | None, commit: str) -> tuple[dict[str, str], bytes]:
    """The commit's description and the tar of its ``libs/libcommon``, from a git directory or an archive."""
    if git_dir is not None:
        git_dir = resolve_git_dir(git_dir)
        resolved = resolve_commit(git_dir, commit)
        return resolved, git(git_dir, "archive", "--format=tar", resolved["commit"], LIBCOMMON_PATH)
    path = find_archive(commit)
    with gzip.open(path) as compressed:
        archive = compressed.read()
    written = archive_commit(archive)
    if written is not None and written != commit:
        raise SetupError(f"{path} holds commit {written}, not {commit}")
    return {"commit": commit, "date": archive_date(archive), "subject": f"archive {path.name}"}, archive


def archive_date(archive: bytes) -> str:
    """The commit's date as ``git archive`` stamps every member (its committer time)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        first = tar.next()
        stamp = first.mtime if first is not None else 0
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def setup(
    git_dir: Path | None, label: str, commit: str | None, python: str, extra: list[str], force: bool
) -> dict[str, Any]:
    started = time.monotonic()
    if commit is None:
        if label not in KNOWN_LABELS:
            raise SetupError(f"label {label!r} has no pinned commit: give --commit (known: {sorted(KNOWN_LABELS)})")
        commit = KNOWN_LABELS[label]["commit"]
    if git_dir is None and len(commit) != 40:
        raise SetupError(f"an archive is found by the full commit id, not {commit!r}: give all 40 digits")
    directory = label_dir(label)
    manifest_path = directory / MANIFEST
    if manifest_path.exists() and not force:
        ready: dict[str, Any] = json.loads(manifest_path.read_text())
        same_commit = ready.get("commit") == commit or (
            git_dir is not None and str(ready.get("commit", "")).startswith(commit)
        )
        wanted = pinned_requirements(directory / "source", extra)[0] if (directory / "source").exists() else None
        if same_commit and ready.get("requirements") == wanted:
            log(f"{label}: already set up at {ready['commit'][:9]} in {directory} (--force to redo)")
            return ready
        if same_commit:
            log(f"{label}: set up at {ready['commit'][:9]} with other requirements than these: redone")
    resolved, archive = libcommon_at(git_dir, commit)
    if directory.exists():
        log(f"{label}: removing {directory}")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)

    source = directory / "source"
    log(f"{label}: extracting {LIBCOMMON_PATH} at {resolved['commit'][:9]} ({resolved['date']}, {resolved['subject']})")
    extract_libcommon(archive, source)
    requirements, deviations, declared_python = pinned_requirements(source, extra)
    (directory / "requirements.txt").write_text(
        f"# dependencies of libcommon at {resolved['commit']}, pinned to its poetry.lock\n"
        + "\n".join(requirements)
        + "\n"
    )

    run([python, "-m", "venv", str(directory / "venv")], f"{label}: virtualenv")
    interpreter = venv_python(directory)
    pip = [str(interpreter), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run(pip + ["-r", str(directory / "requirements.txt")], f"{label}: dependencies", RegistryError)
    # libcommon itself, from the extracted source; its pyproject pins one exact Python
    # (3.9.15 in 2023, 3.14.5 in 2026) and the tests run it on this one.
    run(pip + ["--no-deps", "--ignore-requires-python", str(source)], f"{label}: libcommon")

    check = subprocess.run([str(interpreter), str(DRIVER), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        tail = "\n".join(check.stderr.strip().splitlines()[-20:])
        raise SetupError(
            f"{label}: libcommon does not import in {directory / 'venv'}:\n{tail}\n"
            "Add what is missing with --extra 'package==version' and run setup again."
        )
    description = json.loads(check.stdout)["result"]
    broken = {
        module: error
        for module, error in description.get("imports", {}).items()
        if module in MUST_IMPORT and error is not None
    }
    if broken:
        raise SetupError(
            f"{label}: {', '.join(f'{module} does not import ({error})' for module, error in broken.items())}.\n"
            "Add what is missing to NEEDED (pinned from the lock), or with --extra 'package==version'."
        )
    freeze = subprocess.run(
        [str(interpreter), "-m", "pip", "freeze", "--disable-pip-version-check"], capture_output=True, text=True
    ).stdout.split()
    manifest = {
        "label": label,
        "commit": resolved["commit"],
        "commit_date": resolved["date"],
        "commit_subject": resolved["subject"],
        "why": KNOWN_LABELS.get(label, {}).get("why") if commit == KNOWN_LABELS.get(label, {}).get("commit") else None,
        "declared_python": declared_python,
        "python": description["python"],
        "mongoengine": description["mongoengine"],
        "pymongo": description["pymongo"],
        "collections": description["models"],
        "generation": description["generation"],
        "requirements": requirements,
        "deviations_from_lock": deviations,
        "installed": freeze,
        "install_seconds": round(time.monotonic() - started, 1),
        "size_bytes": directory_size(directory),
        "created_at": datetime.now(UTC).isoformat(),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    log(
        f"{label}: ready in {manifest['install_seconds']} s, {manifest['size_bytes'] / 1e6:.0f} MB; "
        f"mongoengine {manifest['mongoengine']}, pymongo {manifest['pymongo']}, Python {manifest['python']}; "
        f"collections: {', '.join(sorted(manifest['collections']))}"
    )
    return manifest


def status() -> int:
    root = cache_root()
    labels = sorted(set(KNOWN_LABELS) | ({p.name for p in root.iterdir() if p.is_dir()} if root.exists() else set()))
    for label in labels:
        manifest_path = label_dir(label) / MANIFEST
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
            print(
                f"{label}: ready, {manifest['commit'][:9]} ({manifest['commit_date'][:10]}), "
                f"mongoengine {manifest['mongoengine']}, pymongo {manifest['pymongo']}, "
                f"{manifest['size_bytes'] / 1e6:.0f} MB, {label_dir(label)}"
            )
        else:
            print(f"{label}: not set up ({label_dir(label)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("setup", help="extract libcommon at a commit and install it in its own venv")
    make.add_argument(
        "--git-dir",
        type=Path,
        help="a git directory of huggingface/dataset-viewer (clone or bare mirror); default: the commit's archive",
    )
    which = make.add_mutually_exclusive_group(required=True)
    which.add_argument("--label", help=f"cache folder name; pinned commits: {sorted(KNOWN_LABELS)}")
    which.add_argument("--all", action="store_true", help="every pinned label")
    make.add_argument("--commit", help="commit to set up (default: the label's pinned commit)")
    make.add_argument("--python", default="python3.11", help="interpreter for the venv (default: python3.11)")
    make.add_argument(
        "--extra",
        action="append",
        default=[],
        help="an extra or replacing requirement, e.g. 'pymongo==4.6.3' (repeatable)",
    )
    make.add_argument("--force", action="store_true", help="rebuild even when already set up at that commit")
    commands.add_parser("status", help="what is set up, where")
    options = parser.parse_args(argv)
    if options.command == "status":
        return status()
    labels = sorted(KNOWN_LABELS) if options.all else [options.label]
    if options.all and options.commit:
        parser.error("--commit goes with one --label")
    failed = False
    for label in labels:
        try:
            setup(options.git_dir, label, options.commit, options.python, options.extra, options.force)
        except RegistryError as error:  # recorded: the era's tests skip with it; the other eras go on
            record_failure(label, str(error))
            print(f"[deployment_client] {label}: the registry did not provide its pins: {error}", file=sys.stderr)
        except SetupError as error:  # not recorded: the era's tests fail under CI, saying it is not set up
            print(f"[deployment_client] error: {error}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def record_failure(label: str, reason: str) -> None:
    """Why ``label`` could not be set up, where its tests look (``tests/deployment_client.missing_reason``)."""
    directory = label_dir(label)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / FAILURE).write_text(
        json.dumps({"label": label, "reason": reason, "at": datetime.now(UTC).isoformat()}, indent=2) + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
