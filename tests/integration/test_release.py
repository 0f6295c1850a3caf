"""The release: a wheel built from this checkout carries the SQL, installs in
a fresh virtualenv, and runs the README's quickstart from there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import pytest
from tests.conftest import scratch_database

from batonq.migrate import migrations

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]

pytestmark = pytest.mark.release


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new virtualenv holding the wheel (not the checkout). Its
    dependencies are the dev venv's, seen through a .pth line: a line, not
    that venv's own .pth files, so the checkout's editable install stays out."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    purelib = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
    ).strip()
    Path(purelib, "dev_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def test_the_sdist_carries_the_sql(tmp_path: Path) -> None:
    _run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", tmp_path, ROOT, cwd=ROOT)
    [sdist] = tmp_path.glob("batonq-*.tar.gz")
    with tarfile.open(sdist) as archive:
        shipped = {Path(*Path(name).parts[1:]) for name in archive.getnames()}
    sql = {p.relative_to(ROOT) for p in (ROOT / "src" / "batonq" / "sql").rglob("*.sql")}
    assert sql and sql <= shipped
    assert Path("sql", "batonq.sql") in shipped, "psql -f sql/batonq.sql works from the sdist too"
    assert {Path("pyproject.toml"), Path("README.md"), Path("CHANGELOG.md")} <= shipped


def test_the_wheel_installs_and_runs_the_readme_quickstart(server_dsn: str, tmp_path: Path) -> None:
    _run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--wheel",
        "--outdir",
        tmp_path / "dist",
        ROOT,
        cwd=ROOT,
    )
    [wheel] = (tmp_path / "dist").glob("batonq-*.whl")
    assert wheel.name == f"batonq-{VERSION}-py3-none-any.whl"
    venv = _fresh_venv(tmp_path, wheel)
    bin_ = venv / "bin"
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "worker_quickstart.py", work)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"

    where = _run(
        bin_ / "python", "-c", "import batonq; print(batonq.__file__, batonq.__version__)", cwd=work, env=env
    )
    module, version = where.split()
    assert Path(module).is_relative_to(venv), "the wheel's batonq, not the checkout's"
    assert version == VERSION
    assert _run(bin_ / "batonq", "--version", cwd=work, env=env) == f"batonq, version {VERSION}\n"

    with scratch_database(server_dsn, "batonq_r") as dsn:
        env["BATONQ_DATABASE_URL"] = dsn
        every = "".join(f"applied {m.version:04d}_{m.name}\n" for m in migrations())
        assert _run(bin_ / "batonq", "migrate", cwd=work, env=env) == every + "applied the engine\n"
        # The README's quickstart, as it says.
        _run(bin_ / "python", "worker_quickstart.py", cwd=work, env=env)
        _run(bin_ / "batonq", "worker", "worker_quickstart:app", "--burst", cwd=work, env=env)
        listing = _run(bin_ / "batonq", "tasks", "emails", cwd=work, env=env)
        rows = {line.split()[0]: line.split()[1] for line in listing.splitlines()[1:]}
        assert sorted(rows.values()) == ["dead", "done", "done"], listing
        [dead] = [task_id for task_id, state in rows.items() if state == "dead"]
        assert "not an address: nobody" in _run(bin_ / "batonq", "task", dead, cwd=work, env=env)
