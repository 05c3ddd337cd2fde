"""The REST client the CLI uses, and where it finds the API and its token."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {format_detail(detail)}")


class Unreachable(RuntimeError):
    """The API did not answer at all (connection refused, reset, timed out)."""


def format_detail(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)


def adc_home() -> Path:
    return Path(os.environ.get("ADC_HOME", ".adc"))


def saved_credentials() -> tuple[str | None, str | None]:
    url, token = os.environ.get("ADC_API_URL"), os.environ.get("ADC_TOKEN")
    creds = adc_home() / "credentials.json"
    if (not url or not token) and creds.exists():
        saved = json.loads(creds.read_text())
        url, token = url or saved.get("api_url"), token or saved.get("token")
    return url, token


def load_credentials() -> tuple[str, str]:
    url, token = saved_credentials()
    if not url or not token:
        raise SystemExit("adc: no API to talk to: set ADC_API_URL and ADC_TOKEN, or run `adc up` first")
    return url, token


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text


class ApiClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    @classmethod
    def from_env(cls) -> ApiClient:
        return cls(*load_credentials())

    def call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as err:
            raise Unreachable(f"cannot reach the API at {self.http.base_url}: {type(err).__name__}: {err}") from None
        if r.status_code >= 400:
            raise ApiError(r.status_code, _detail(r))
        return r.json() if r.content else None

    @contextmanager
    def stream(
        self,
        path: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Iterator[httpx.Response]:
        """An open streaming response; ApiError for an HTTP error, Unreachable if there was no answer."""
        timeout = httpx.Timeout(10.0, read=read_timeout)
        try:
            with self.http.stream(
                "GET", path, params=_present(params or {}), headers=headers or {}, timeout=timeout
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(r.status_code, _detail(r))
                yield r
        except httpx.TransportError as err:
            raise Unreachable(f"{type(err).__name__}: {err}") from None

    @contextmanager
    def events(
        self,
        path: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Iterator[Iterator[ServerSentEvent]]:
        """The Server-Sent Events of an open stream (parsed by httpx-sse); errors as `stream` raises them."""
        with self.stream(path, params, headers, read_timeout) as response:
            yield EventSource(response).iter_sse()

    # --- jobs ------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", "/v1/jobs", json=spec)

    def jobs(self, **params) -> dict[str, Any]:
        return self.call("GET", "/v1/jobs", params=_present(params))

    def job(self, job_id: str) -> dict[str, Any]:
        return self.call("GET", f"/v1/jobs/{path_segment(job_id)}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.call("POST", f"/v1/jobs/{path_segment(job_id)}/cancel")

    def job_metrics(self, job_id: str, **params) -> dict[str, Any]:
        return self.call("GET", f"/v1/jobs/{path_segment(job_id)}/metrics", params=_present(params))

    def job_events(self, job_id: str, **params) -> dict[str, Any]:
        return self.call("GET", f"/v1/jobs/{path_segment(job_id)}/events", params=_present(params))

    def job_action(self, job_id: str, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("POST", f"/v1/jobs/{path_segment(job_id)}/{action}", json=body)

    # --- cluster ---------------------------------------------------------------------

    def nodes(self) -> dict[str, Any]:
        return self.call("GET", "/v1/nodes")

    def node_action(self, node: str, action: str) -> dict[str, Any]:
        return self.call("POST", f"/v1/nodes/{path_segment(node)}/{action}")

    def controller(self, action: str | None = None, reason: str | None = None) -> dict[str, Any]:
        if action is None:
            return self.call("GET", "/v1/controller")
        return self.call("POST", f"/v1/controller/{action}", json={"reason": reason})

    # --- audit -----------------------------------------------------------------------

    def audit(self, **params) -> dict[str, Any]:
        return self.call("GET", "/v1/audit", params=_present(params))

    def audit_verify(self, anchor: dict[str, Any] | None = None) -> dict[str, Any]:
        params = {"anchor_id": anchor["last_id"], "anchor_hash": anchor["last_hash"]} if anchor else None
        return self.call("GET", "/v1/audit/verify", params=params, timeout=httpx.Timeout(10.0, read=None))

    # --- admin -----------------------------------------------------------------------

    def policy(self) -> dict[str, Any]:
        return self.call("GET", "/v1/policies")

    def policy_history(self, limit: int = 20) -> dict[str, Any]:
        return self.call("GET", "/v1/policies/history", params={"limit": limit})

    def set_policy(self, policy: dict[str, Any], reason: str, expected_version: int | None = None) -> dict[str, Any]:
        return self.call(
            "PUT", "/v1/policies", json={"policy": policy, "reason": reason, "expected_version": expected_version}
        )

    def reload_policy(self, reason: str | None = None) -> dict[str, Any]:
        return self.call("POST", "/v1/policies/reload", json={"reason": reason})

    def quotas(self) -> dict[str, Any]:
        return self.call("GET", "/v1/quotas")

    def set_quota(self, team: str, quota: dict[str, Any]) -> dict[str, Any]:
        return self.call("PUT", f"/v1/quotas/{path_segment(team)}", json=quota)

    def delete_quota(self, team: str) -> None:
        self.call("DELETE", f"/v1/quotas/{path_segment(team)}")

    def tokens(self, include_revoked: bool = False) -> dict[str, Any]:
        return self.call("GET", "/v1/tokens", params={"include_revoked": include_revoked})

    def create_token(self, name: str, role: str, team: str, ttl_days: float | None) -> dict[str, Any]:
        return self.call("POST", "/v1/tokens", json={"name": name, "role": role, "team": team, "ttl_days": ttl_days})

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self.call("POST", f"/v1/tokens/{path_segment(token_id)}/revoke")

    def me(self) -> dict[str, Any]:
        return self.call("GET", "/v1/me")


def _present(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def path_segment(value: str) -> str:
    """One path segment: a slash or dot-dot in an id must not reach another route."""
    from urllib.parse import quote

    return quote(value, safe="").replace(".", "%2E")
