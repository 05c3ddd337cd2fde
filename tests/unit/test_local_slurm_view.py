"""The one-host cluster's compute-node view (cli/local_slurm.py): which folders become an empty tmpfs with
the jobs' folders bound back, so the teams' uids reach ADC's code without the host changing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from cli.local_slurm import node_view


@pytest.fixture
def open_tmp():
    """A folder every uid passes through, and every one above it (pytest's own are the owner's only)."""
    folder = Path(tempfile.mkdtemp(prefix="adc-node-view-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_only_folders_under_a_closed_one_are_bound_back_under_its_outermost(open_tmp):
    tmp_path = open_tmp
    closed = tmp_path / "home"
    (closed / "inner").mkdir(parents=True)
    closed.chmod(0o700)
    (closed / "inner").chmod(0o700)
    code = closed / "inner" / "code"
    env = closed / "env"
    (code / "pkg").mkdir(parents=True)
    env.mkdir()
    open_one = tmp_path / "open"
    open_one.mkdir()
    missing = tmp_path / "missing"
    view = node_view([code, code / "pkg", env, open_one, missing])
    assert view == {closed: [env, code]}  # the outermost closed folder; code/pkg is inside code already
