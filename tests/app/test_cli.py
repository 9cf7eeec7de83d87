"""The command line: the embedded server's ``db`` commands, and a missing server said plainly, never a traceback.

``simulate`` and ``demo`` run, with credentials in their URLs, in tests/test_secrets.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.servers import child_env, kill_recorded_server, wait_until_gone
from zombie_pipeline import embedded
from zombie_pipeline.app import cli
from zombie_pipeline.config import HOME_ENV
from zombie_pipeline.embedded import INSTALL_HINT, ServerInfo

PYTHON = sys.executable
_CONSOLE_SCRIPT = Path(sys.executable).parent / "zombie-pipeline"
# the installed console script; the same main() through -m when the package is not installed
CLI = [str(_CONSOLE_SCRIPT)] if _CONSOLE_SCRIPT.exists() else [PYTHON, "-m", "zombie_pipeline.app.cli"]


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=child_env(home), capture_output=True, text=True, timeout=120)


def test_cli_db_start_status_stop(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        assert cli.main(["db", "status"]) == 1
        assert "no embedded server running" in capsys.readouterr().out

        started = run_cli(home, "db", "start")
        assert started.returncode == 0, started.stderr
        info = ServerInfo(**json.loads((home / "server.json").read_text()))
        assert f"pid {info.pid}" in started.stdout and info.url in started.stdout

        status = run_cli(home, "db", "status")
        assert status.returncode == 0
        assert f"pid {info.pid}" in status.stdout

        stopped = run_cli(home, "db", "stop")
        assert stopped.returncode == 0
        assert f"stopped embedded server pid {info.pid}" in stopped.stdout
        assert wait_until_gone(info.pid)
        assert cli.main(["db", "status"]) == 1
    finally:
        kill_recorded_server(home)


def test_cli_without_server_or_url_prints_what_to_do_not_a_traceback(tmp_path):
    code = (
        "import sys, zombie_pipeline.embedded as e; e.SERVER_EXECUTABLE = 'secantusd-py-not-installed'; "
        "from zombie_pipeline.app.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [PYTHON, "-c", code, "simulate", "--finished", "10"],
        env=child_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2
    assert result.stderr.strip() == f"zombie-pipeline: {INSTALL_HINT}"
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_db_start_reports_the_missing_server_in_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(embedded, "SERVER_EXECUTABLE", "secantusd-py-not-installed")

    assert cli.main(["db", "start"]) == 2

    captured = capsys.readouterr()
    assert "pip install" in captured.err
    assert captured.out == ""
