"""Atomic writes (`uturn_train/io.py`)."""

import os

import pytest

from uturn_train.io import write_json


def test_an_atomic_write_gets_the_mode_a_plain_open_would(tmp_path):
    plain, atomic = tmp_path / "plain.json", tmp_path / "atomic.json"
    plain.write_text("{}")
    write_json(atomic, {})
    assert os.stat(atomic).st_mode & 0o777 == os.stat(plain).st_mode & 0o777  # not mkstemp's 0600


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):
        write_json(tmp_path / "out.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []
