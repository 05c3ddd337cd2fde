"""`adc sim --pass-gap`: refused with a clear error when it is not a number of seconds; otherwise
it reaches the simulation (a wider gap, fewer passes)."""

import json
from pathlib import Path

import pytest

from cli.main import main

TRACE = str(Path(__file__).resolve().parents[2] / "simulation" / "fixtures" / "itp_cluster02_first300.csv")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_a_bad_pass_gap_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sim", TRACE, "--gpus", "96", "--pass-gap", value])
    assert exit_.value.code == 2
    assert "--pass-gap" in capsys.readouterr().err


def test_the_pass_gap_reaches_the_simulation(capsys):
    passes = {}
    for gap in ("0", "120"):
        assert (
            main(["sim", TRACE, "--gpus", "96", "--days", "2", "--policy", "adc", "--pass-gap", gap, "-o", "json"]) == 0
        )
        passes[gap] = json.loads(capsys.readouterr().out)["policies"][0]["passes"]
    assert 0 < passes["120"] < passes["0"]
