"""The REST client the CLI uses, and where it finds the API and its token."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {format_detail(detail)}")


def format_detail(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)


def adc_home() -> Path:
    return Path(os.environ.get("ADC_HOME", ".adc"))


def load_credentials() -> tuple[str, str]:
    url, token = os.environ.get("ADC_API_URL"), os.environ.get("ADC_TOKEN")
    creds = adc_home() / "credentials.json"
    if (not url or not token) and creds.exists():
        saved = json.loads(creds.read_text())
        url, token = url or saved.get("api_url"), token or saved.get("token")
    if not url or not token:
        raise SystemExit("adc: no API to talk to: set ADC_API_URL and ADC_TOKEN, or run `adc up` first")
    return url, token


class ApiClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    @classmethod
    def from_env(cls) -> "ApiClient":
        return cls(*load_credentials())

    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as err:
            raise SystemExit(f"adc: cannot reach the API at {self.http.base_url}: {err}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ApiError(r.status_code, detail)
        return r.json()

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=spec)

    def jobs(self, **params) -> dict[str, Any]:
        return self._call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v is not None})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def nodes(self) -> dict[str, Any]:
        return self._call("GET", "/v1/nodes")

    def audit(self, **params) -> dict[str, Any]:
        return self._call("GET", "/v1/audit", params={k: v for k, v in params.items() if v is not None})
