"""Two workers replacing the same file of one attempt folder at once (the ranks of a multi-node job on
one host write `train.yaml` side by side): every write lands whole, none fails, nothing is left beside it."""

from __future__ import annotations

import os
import threading

from worker import job_files


def test_writers_racing_on_one_name_all_succeed_and_leave_one_whole_file(tmp_path):
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    failures: list[BaseException] = []
    payloads = [bytes([65 + w]) * 4096 for w in range(4)]

    def writer(data: bytes) -> None:
        try:
            for _ in range(300):
                job_files.write_file(dir_fd, "train.yaml", data)
        except BaseException as err:  # noqa: BLE001 - what a racing writer hit is the finding
            failures.append(err)

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(dir_fd)
    assert failures == []
    assert (tmp_path / "train.yaml").read_bytes() in payloads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]
