"""The dashboard as a person uses it, in headless Chromium against the whole stack: sign in with
a token, watch a running job's loss curve grow, see a manual migration in the audit stream and
in the job's placement history, and see nothing of another team's jobs."""
from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.test_loop import lora_job

TIMEOUT_MS = 60_000
expect.set_options(timeout=TIMEOUT_MS)  # waits end as soon as the page shows it; this only bounds them


@pytest.fixture(scope="module")
def job(live, team_tokens, tiny_model, data_dir) -> dict:
    """A long LoRA job of team alpha, cancelled once the module is done with it."""
    spec = lora_job(tiny_model, data_dir, name="watched", steps=5000)
    spec["train"] |= {"logging_steps": 1, "save_steps": 1000}
    with httpx.Client(base_url=live.stack.api_url, headers={"Authorization": f"Bearer {team_tokens['alpha']}"}) as http:
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        submitted = r.json()
        yield submitted
        http.post(f"/v1/jobs/{submitted['id']}/cancel")


def sign_in(browser, live, token: str):
    context = browser.new_context(base_url=live.stack.api_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto("/ui")
    page.fill("#login-token", token)
    page.click("#login-submit")
    expect(page.locator("#nav")).to_be_visible()
    return context, page


def points(page) -> int:
    return int(page.locator("#loss-chart").get_attribute("data-points") or 0)


def wait_points(page, at_least: int, timeout_s: float = 60) -> int:
    """The number of points on the loss curve, once it reaches `at_least` (the page's CSP rules out
    wait_for_function's evaluated predicates)."""
    deadline = time.monotonic() + timeout_s
    while (n := points(page)) < at_least:
        assert time.monotonic() < deadline, f"the loss curve has {n} points, never {at_least}"
        page.wait_for_timeout(200)
    return n


def test_sign_in_and_watch_the_loss_curve_grow(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    expect(page.locator("#who")).to_have_text("alpha-user (user, team alpha)")
    # The session is an HttpOnly, SameSite=Strict cookie; the token is in no URL.
    cookie = next(c for c in context.cookies() if c["name"] == "adc_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert team_tokens["alpha"] not in page.url

    page.goto(f"/ui#/job/{job['id']}")
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    first = wait_points(page, 2)
    # Several live updates, each a new point on the curve, with no reload.
    assert wait_points(page, first + 3) >= first + 3
    page.screenshot(path=str(artifacts / "job-loss-curve.png"), full_page=True)

    page.goto("/ui#/jobs")
    row = page.locator(f'#jobs-table tr[data-job-id="{job["id"]}"]')
    expect(row.locator("td.curve canvas")).to_have_count(1)
    page.screenshot(path=str(artifacts / "jobs.png"), full_page=True)
    context.close()


def test_manual_migration_shows_in_audit_stream_and_placement_history(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    page.goto(f"/ui#/job/{job['id']}")
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    source = live.job(job["id"])["placement"][0]["node"]
    target = "node-2" if source == "node-1" else "node-1"

    audit = context.new_page()
    audit.goto(f"/ui#/audit")
    expect(audit.locator("#audit-table")).to_be_visible()

    r = live.http.post(f"/v1/jobs/{job['id']}/migrate", json={"target_node": target})  # an operator moves it
    assert r.status_code == 202, r.text

    # The audit page, already open, receives the decision live.
    moved = f'#audit-table tr[data-kind="decision"][data-action="migrate"][data-job-id="{job["id"]}"]'
    expect(audit.locator(moved)).to_have_count(1)
    audit.screenshot(path=str(artifacts / "audit-migration.png"), full_page=True)
    # The job page shows the move and where it went, then the job training on the target.
    history = page.locator("#placement-history")
    expect(history.locator('tr[data-kind="decision"][data-action="migrate"]')).to_have_count(1)
    expect(history.locator('tr[data-kind="job.migrating"]')).to_have_count(1)
    expect(page.locator('[data-fact="placement"]')).to_contain_text(target)
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    page.screenshot(path=str(artifacts / "job-after-migration.png"), full_page=True)
    context.close()


def test_a_user_of_another_team_sees_none_of_its_jobs(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["beta"])
    page.goto("/ui#/jobs")
    expect(page.locator("#jobs-table[data-loaded]")).to_be_visible()
    expect(page.locator(f'#jobs-table tr[data-job-id="{job["id"]}"]')).to_have_count(0)

    page.goto("/ui#/cluster")
    held = page.locator('.gpu[data-job="(another team)"]')
    expect(held).to_have_count(1)  # the device is shown taken, not by what
    assert job["id"] not in page.content()
    # Live telemetry: each GPU filled as far as its memory is in use (GPU_USAGE).
    expect(page.locator('.gpu[data-gpu="node-1/0"]')).to_contain_text("mem 60%")
    expect(page.locator('.gpu[data-gpu="node-2/1"] .mem')).to_have_attribute("style", re.compile(r"height: 10%"))
    page.screenshot(path=str(artifacts / "cluster-other-team.png"), full_page=True)

    page.goto(f"/ui#/audit")
    expect(page.locator("#audit-table")).to_be_visible()
    page.wait_for_timeout(500)  # the backlog arrives at once; none of it may be the other team's
    expect(page.locator(f'#audit-table tr[data-job-id="{job["id"]}"]')).to_have_count(0)
    context.close()
