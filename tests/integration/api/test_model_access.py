"""A model folder the trainer's uid could not read is refused at submission (422 naming the file
and why), not accepted to fail at load once the job has started."""

from __future__ import annotations

import os


def test_a_model_file_the_trainer_cannot_read_is_refused_naming_it(api, tmp_path_factory):
    folder = tmp_path_factory.mktemp("private-model")  # inside the api's shared root (pytest's base folder)
    folder.chmod(0o755)
    (folder / "config.json").write_text("{}")
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    spec = api.job_spec("private")
    spec["train"]["model_name_or_path"] = str(folder)
    os.chmod(weights, 0o600)  # the api's own (root's) only: the trainer runs as nobody
    with api.client("user") as http:
        refused = http.post("/v1/jobs", json=spec)
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["detail"]
        assert problem["loc"] == ["train", "model_name_or_path"]
        assert str(weights) in problem["msg"] and "not readable by the trainer" in problem["msg"], problem
        assert "-rw-------" in problem["msg"] and "uid 65534" in problem["msg"], problem

        os.chmod(weights, 0o644)
        folder.chmod(0o700)  # the folder itself, now
        refused = http.post("/v1/jobs", json=spec)
        assert refused.status_code == 422, refused.text
        assert f"'{folder}' is not readable by the trainer" in refused.json()["detail"][0]["msg"]

        folder.chmod(0o755)
        accepted = http.post("/v1/jobs", json=spec)
        assert accepted.status_code == 201, accepted.text
        http.post(f"/v1/jobs/{accepted.json()['id']}/cancel")
