"""The path checks of a team's roots: what their cheaper forms must still answer as before."""

from __future__ import annotations

import itertools
import os
import tracemalloc
from pathlib import Path

import pytest

from shared.specs.tenant_paths import Refused, read_small_file, within

PATHS = [
    "/", "//", "//a", "/a", "/a/b", "/ab", "/a/bc", "/a/b/c", "/a/b/../c", "/a/./b", "/a b/c", "/.a", "/a/..",
    "a", "a/b", ".", "..", "../a", "ab",
]  # fmt: skip


@pytest.mark.parametrize("root", PATHS)
def test_within_answers_as_pathlib_compares_parts(root):
    for path in PATHS:
        expected = Path(path) == Path(root) or Path(path).is_relative_to(Path(root))
        assert within(Path(path), (Path(root),)) is expected, (path, root)


def test_within_any_of_several_roots():
    roots = (Path("/srv/models"), Path("/data/shared"))
    assert within(Path("/data/shared/x.json"), roots)
    assert within(Path("/srv/models"), roots)
    assert not within(Path("/srv/models-other/x"), roots)  # a sibling sharing the prefix is outside
    assert not within(Path("/srv"), roots)
    assert not within(Path("/srv/x"), ())
    for a, b in itertools.permutations(roots):
        assert within(Path("/srv/models/a/b"), (a, b))


def test_a_small_file_is_read_without_allocating_the_size_limit(tmp_path):
    small = tmp_path / "config.json"
    small.write_text('{"model_type": "llama"}')
    tracemalloc.start()
    try:
        assert read_small_file(small, "model", 16 * 2**20) == b'{"model_type": "llama"}'
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak  # asking for 16 MiB + 1 allocated all of it for a 23-byte file


def test_the_size_limit_still_holds_to_the_byte(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_small_file(path, "f", 100) == b"x" * 100
    with pytest.raises(Refused, match="over the 99-byte limit"):
        read_small_file(path, "f", 99)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert read_small_file(empty, "f", 100) == b""


def test_a_file_that_grows_after_its_size_was_read_is_read_to_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "growing"
    path.write_bytes(b"x" * 10)
    real_fstat = os.fstat

    def grown(fd):  # the size seen before a writer appended 90 bytes
        info = real_fstat(fd)
        with open(path, "ab") as f:
            f.write(b"y" * 90)
        return info

    monkeypatch.setattr(os, "fstat", grown)
    assert read_small_file(path, "f", 1000) == b"x" * 10 + b"y" * 90
    path.write_bytes(b"x" * 10)
    with pytest.raises(Refused, match="over the 50-byte limit"):
        read_small_file(path, "f", 50)
