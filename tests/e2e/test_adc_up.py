"""`adc up`: the whole stack from one command, the API URL on a line of its own, Ctrl-C stops all."""
import os
import re
import signal
import subprocess
import sys
import time

import httpx

from tests.conftest import Isolated


def test_adc_up_serves_and_ctrl_c_stops_every_process(tmp_path):
    env_ = Isolated().open()
    env = os.environ | {"NATS_URL": env_.nats_url, "DATABASE_URL": env_.database_url, "ADC_BUS_PREFIX": env_.prefix}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "up", "--home", str(tmp_path / "home"), "--port", "0",
                             "--workers", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if re.fullmatch(r"http://127\.0\.0\.1:\d+\n", line):
                url = line.strip()
        assert url, "".join(lines)
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        pids = [int(m.group(1)) for m in re.finditer(r"pid (\d+)", "".join(lines))]
        assert len(pids) == 6  # audit sink, api, executor, decider, one worker, one collector
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        time.sleep(0.5)
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        assert not alive, f"still running after Ctrl-C: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
        env_.close()
