"""A hostile tenant's spec values, through the real api on the real Postgres and NATS.

Team alpha owns <teams>/alpha, team beta <teams>/beta; <teams>/trusted is where a model's own Python
may run. Each attack is refused with 422 naming the field: model code outside the trusted roots
(whatever the model folder holds), numbers outside their bounds, an inline DeepSpeed mapping that
its file would be refused for, invalid Unicode; and specs built to be expensive to check are refused
before any per-key work, so another team's valid spec is checked meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.api.conftest import serving_api


def _model(folder: Path, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def teams(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("teams")
    models = root / "alpha" / "models"
    _model(models / "plain")
    # What transformers ran with trust_remote_code, though no config.json / tokenizer / processor declared it:
    _model(models / "custom-generate", {"custom_generate/generate.py": "import os; os.system('id')\n"})
    _model(
        models / "video-auto-map",
        {
            "video_preprocessor_config.json": json.dumps({"auto_map": {"AutoVideoProcessor": "video.Evil"}}),
            "video.py": "import os; os.system('id')\n",
        },
    )
    _model(root / "trusted" / "vetted", {"custom_generate/generate.py": "def generate(model, **kw): ...\n"})
    _model(root / "beta" / "models" / "plain")
    return root


@pytest.fixture(scope="module")
def api(tmp_path_factory, teams):
    yield from serving_api(
        tmp_path_factory,
        {
            "tenancy": {
                "team_roots": {"alpha": [str(teams / "alpha")], "beta": [str(teams / "beta")]},
                "shared_roots": [str(REPO_ROOT / "examples"), str(teams / "trusted")],
                "trusted_code_roots": [str(teams / "trusted")],
            },
            "controller": {"max_gpus_per_node": 8, "max_job_gpus": 64},
        },
    )


def spec(teams: Path, fields: dict | None = None, **train) -> dict:
    return {
        "name": "edges",
        "gpus": 1,
        **(fields or {}),
        "train": {
            "model_name_or_path": str(teams / "alpha" / "models" / "plain"),
            "stage": "sft",
            "finetuning_type": "lora",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(REPO_ROOT / "examples" / "data"),
            "max_steps": 2,
            **train,
        },
    }


def post(api, body, token: str = "user", content_type: str = "application/json"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    with api.client(token) as http:
        return http.post("/v1/jobs", content=data, headers={"Content-Type": content_type})


def refused(api, body, token: str = "user", content_type: str = "application/json") -> dict[str, str]:
    r = post(api, body, token, content_type)
    assert r.status_code == 422, (r.status_code, r.text[:2000])
    return {".".join(map(str, e["loc"])): e["msg"] for e in r.json()["detail"]}


# --- model code runs only from trusted roots --------------------------------------------------------


@pytest.mark.parametrize("model", ["plain", "custom-generate", "video-auto-map"])
def test_trust_remote_code_outside_the_trusted_roots_is_refused_whatever_the_folder_holds(api, teams, model):
    folder = teams / "alpha" / "models" / model
    errors = refused(api, spec(teams, model_name_or_path=str(folder), trust_remote_code=True))
    msg = errors["train.trust_remote_code"]
    assert "trusted_code_roots" in msg and str(folder) in msg, errors


def test_trust_remote_code_inside_the_trusted_roots_is_allowed(api, teams):
    r = post(api, spec(teams, model_name_or_path=str(teams / "trusted" / "vetted"), trust_remote_code=True))
    assert r.status_code == 201, r.text
    assert post(api, spec(teams, trust_remote_code=False)).status_code == 201  # false: nothing runs


def test_trust_remote_code_covers_every_model_the_job_loads(api, teams):
    errors = refused(
        api,
        spec(
            teams,
            model_name_or_path=str(teams / "trusted" / "vetted"),
            trust_remote_code=True,
            stage="dpo",
            dataset="dpo_en_demo",
            ref_model=str(teams / "alpha" / "models" / "plain"),
        ),
    )
    assert "ref_model" in errors["train.trust_remote_code"], errors


# --- numbers within bounds --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        (b'{"name": "n", "train": {"max_steps": 1' + b"0" * 400 + b"}}", "max_steps"),  # 1 followed by 400 zeros
        (b'{"name": "n", "train": {"max_steps": 100000000000}}', "train.max_steps"),  # an int64, over the bound
        (b'{"name": "n", "train": {"max_steps": -5}}', "train.max_steps"),
        (b'{"name": "n", "train": {"seed": 100000000000000000000000}}', "seed"),  # over 64 bits
        (b'{"name": "n", "train": {"learning_rate": "1e400"}}', "train.learning_rate"),  # reads as infinity
        (b'{"name": "n", "train": {"learning_rate": "nan"}}', "train.learning_rate"),
        (b'{"name": "n", "max_gpus": 1' + b"0" * 30 + b', "train": {}}', "max_gpus"),
        (b'{"name": "n", "max_gpus": 500, "multi_node": true, "train": {}}', "max_gpus"),  # over max_job_gpus
        (b'{"name": "n", "max_gpus": 16, "train": {}}', "max_gpus"),  # one node holds 8
        (b'{"name": "n", "gpus": 100, "multi_node": true, "train": {}}', "gpus"),
    ],
)
def test_numbers_outside_their_bounds_are_refused_naming_the_field(api, teams, body, field):
    doc = json.loads(body)
    doc["train"] = {**spec(teams)["train"], **doc["train"]}
    errors = refused(api, json.dumps(doc).encode())
    assert any(loc.endswith(field) for loc in errors), errors


def test_numbers_within_their_bounds_are_accepted(api, teams):
    ok = spec(teams, {"gpus": 2, "max_gpus": 8, "min_gpus": 1}, max_steps=100_000, learning_rate="1e-4", seed=2**40)
    r = post(api, ok)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["train"]["max_steps"] == 100_000


# --- inline DeepSpeed --------------------------------------------------------------------------------


def test_an_inline_deepspeed_mapping_is_checked_like_its_file(api, teams):
    errors = refused(api, spec(teams, deepspeed={"zero_optimization": {"stage": 7}}))
    assert "zero_optimization.stage" in errors["train.deepspeed"], errors
    r = post(api, spec(teams, deepspeed={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    assert r.status_code == 201, r.text


# --- invalid Unicode -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, where",
    [
        (b'{"name": "u", "train": {"\\ud800": 1}}', "train"),  # a lone surrogate in a key
        (b'{"name": "u", "train": {"dataset": "alpaca\\udfff"}}', "train.dataset"),  # ... in a value
        (b'{"name": "u\\ud83d", "train": {}}', "name"),
    ],
)
def test_a_lone_surrogate_is_refused_with_422(api, body, where):
    errors = refused(api, body)
    assert any(loc.removeprefix("body.").startswith(where) and "Unicode" in msg for loc, msg in errors.items()), errors


def test_a_lone_surrogate_elsewhere_is_refused_with_422(api):
    with api.client("admin") as http:
        r = http.post(
            "/v1/tokens",
            content=b'{"name": "x\\ud800", "role": "user", "team": "alpha"}',
            headers={"Content-Type": "application/json"},
        )
    assert r.status_code == 422 and "Unicode" in r.text, (r.status_code, r.text)


# --- validation cost bounded before parsing --------------------------------------------------------


def _hostile(teams: Path, keys: int = 40_000) -> bytes:
    """A spec of about 1 MB: tens of thousands of keys, each one letter off a real argument."""
    names = ["lora_ran", "cutoff_le", "templat", "learning_rat", "max_step"]
    train = spec(teams)["train"] | {f"{names[i % len(names)]}{i}": 1 for i in range(keys)}
    return json.dumps({"name": "hostile", "train": train}, separators=(",", ":")).encode()


def test_a_spec_of_many_near_miss_keys_is_refused_before_they_are_matched(api, teams):
    body = _hostile(teams)
    assert len(body) < api.server.config.api.max_body_bytes
    errors = refused(api, body)
    assert any("spec_limits" in msg for msg in errors.values()), errors
    assert not any("did you mean" in msg for msg in errors.values()), errors
    deep = b'{"name": "d", "train": {"deepspeed": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}}"
    assert any("max_depth" in msg for msg in refused(api, deep).values())


def test_unknown_keys_get_at_most_a_few_suggestions(api, teams):
    errors = refused(api, _hostile(teams, keys=300))
    hints = [msg for msg in errors.values() if "did you mean" in msg]
    assert len(errors) >= 300 and 0 < len(hints) <= 20, (len(errors), len(hints))


def test_another_teams_valid_spec_is_accepted_while_hostile_specs_are_checked(api, teams):
    body, answers = _hostile(teams), []

    def attack() -> None:
        with api.client("user") as http:
            answers.append(http.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"}))

    attackers = [threading.Thread(target=attack) for _ in range(8)]  # more than the api's check threads (6 here)
    for t in attackers:
        t.start()
    try:
        time.sleep(2)  # the hostile bodies are up and being checked
        valid = post(api, spec(teams, model_name_or_path=str(teams / "beta" / "models" / "plain")), token="other_user")
    finally:
        for t in attackers:
            t.join(300)
    # Not 422 "the spec took over api.validation_timeout_s to check": a check thread was free.
    assert valid.status_code == 201, valid.text
    # Each hostile spec refused for its shape, not for the time its check took.
    assert [r.status_code for r in answers] == [422] * 8, [r.text[:300] for r in answers]
    assert all("spec_limits" in r.text for r in answers), [r.text[:300] for r in answers]
