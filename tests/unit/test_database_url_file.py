"""--database-url-file: the URL from a file, on no command line (settings/mechanism.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlease.errors import SettingsError
from runlease.settings import ApiSettings, WorkerSettings, load

URL = "postgresql://u:secret-password@db.example/runs"


@pytest.mark.parametrize("cls", [WorkerSettings, ApiSettings])
def test_the_url_comes_from_the_file(cls: type, tmp_path: Path) -> None:
    path = tmp_path / "url"
    path.write_text(URL + "\n")
    given = {"agent": "runlease.agents.script:agent"} if cls is WorkerSettings else {}
    settings = load(cls, given, environ={"RUNLEASE_DATABASE_URL_FILE": str(path)})
    assert settings.database_url == URL


def test_a_missing_empty_or_doubled_url_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--database-url-file"):
        load(ApiSettings, {"database_url_file": str(tmp_path / "none")}, environ={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="is empty"):
        load(ApiSettings, {"database_url_file": str(tmp_path / "empty")}, environ={})
    (tmp_path / "url").write_text(URL)
    with pytest.raises(SettingsError, match="exclude each other"):
        load(ApiSettings, {"database_url_file": str(tmp_path / "url"), "database_url": URL},
             environ={})
