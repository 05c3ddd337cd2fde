"""The dashboard as a person uses it, in headless Chromium against the whole stack: sign in with
a token, watch a running job's loss curve grow, see a manual migration in the audit stream and
in the job's placement history, see nothing of another team's jobs; watch the GPU the job holds
show its load, the queue with a pending job's reason, the job's live log, the node's history
chart; and find no node twice and no stream left open after navigating quickly between views."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

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
    with alpha_client(live, team_tokens) as http:
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        submitted = r.json()
        yield submitted
        http.post(f"/v1/jobs/{submitted['id']}/cancel")


def alpha_client(live, team_tokens) -> httpx.Client:
    return httpx.Client(base_url=live.stack.api_url, headers={"Authorization": f"Bearer {team_tokens['alpha']}"})


def sign_in(browser, live, token: str):
    context = browser.new_context(base_url=live.stack.api_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.on("pageerror", lambda err: print(f"page error: {err}"))
    page.on(
        "console",
        lambda msg: (
            print(f"page console: {msg.text} {msg.location.get('url', '')}")
            if msg.type in ("warning", "error")
            else None
        ),
    )
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
    audit.goto("/ui#/audit")
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
    # A warm move: the target got ready, the source stopped, the target resumed, each with its time.
    for kind in ("protocol.prepared", "command.stop", "protocol.resumed"):
        expect(history.locator(f'tr[data-kind="{kind}"]')).to_have_count(1)
    expect(history.locator('tr[data-kind="protocol.resumed"]')).to_contain_text("after the source stopped")
    expect(page.locator('[data-fact="placement"]')).to_contain_text(target)
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    # The operator's request names who asked and links the decision it became, whose trail opens.
    asked = history.locator('tr[data-kind="job.move_requested"]')
    expect(asked.locator("td.by")).to_contain_text("(admin, team")  # the stack's admin moved it
    decided = history.locator('tr[data-kind="decision"][data-action="migrate"] td.decision a')
    became = asked.locator("td.decision a")
    expect(asked.locator("td.decision")).to_contain_text("became")
    assert became.get_attribute("href") == decided.get_attribute("href")
    decision_id = decided.get_attribute("href").split("decision_id=")[1]
    # What the caller may do now: a user may pause or cancel it, not migrate it.
    actions = page.locator("#job-actions li")
    expect(actions.first).to_have_attribute("data-command", f"adc pause {job['id']}")
    offered = [actions.nth(i).get_attribute("data-command") for i in range(actions.count())]
    assert offered == [f"adc pause {job['id']}", f"adc cancel {job['id']}"], offered
    page.screenshot(path=str(artifacts / "job-after-migration.png"), full_page=True)
    became.click()
    expect(page.locator('#audit-filters input[name="decision_id"]')).to_have_value(decision_id)
    expect(page.locator(f'#audit-table tr[data-kind="decision"][data-job-id="{job["id"]}"]')).to_have_count(1)
    expect(page.locator('#audit-table tr[data-kind="job.migrating"]')).to_have_count(1)
    expect(page.locator('#audit-table tr[data-kind="job.submitted"]')).to_have_count(0)  # another decision's
    page.goto(f"/ui#/job/{job['id']}")
    page.click("#job-audit-link")
    expect(page.locator('#audit-filters input[name="job_id"]')).to_have_value(job["id"])
    expect(page.locator('#audit-table tr[data-kind="job.submitted"]')).to_have_count(1)
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
    # Its load shows all the same: the trainer's memory on the device it holds.
    expect(held).to_have_attribute("title", re.compile(r": [1-9][\d.]* [KMG]iB of 80.0 GiB in use"))
    page.screenshot(path=str(artifacts / "cluster-other-team.png"), full_page=True)

    page.goto("/ui#/audit")
    expect(page.locator("#audit-table")).to_be_visible()
    page.wait_for_timeout(500)  # the backlog arrives at once; none of it may be the other team's
    expect(page.locator(f'#audit-table tr[data-job-id="{job["id"]}"]')).to_have_count(0)
    context.close()


# --- the views an SRE keeps open -------------------------------------------------------------


@pytest.fixture(scope="module")
def never_fits(live, team_tokens, tiny_model, data_dir) -> dict:
    """A job of team alpha needing 8 devices of a cluster of 4: it waits, and can never fit."""
    spec = lora_job(tiny_model, data_dir, name="too-big", steps=10) | {"gpus": 8, "multi_node": True}
    with alpha_client(live, team_tokens) as http:
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        submitted = r.json()
        yield submitted
        http.post(f"/v1/jobs/{submitted['id']}/cancel")


def held_device(live, job: dict) -> tuple[str, int]:
    first = live.job(job["id"])["placement"][0]
    return first["node"], first["gpus"][0]


def test_the_gpu_a_training_job_holds_shows_its_load_changing(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    page.goto(f"/ui#/job/{job['id']}")
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    node, gpu = held_device(live, job)
    page.goto("/ui#/cluster")
    cell = page.locator(f'.gpu[data-gpu="{node}/{gpu}"]')
    expect(cell).to_have_attribute("data-job", job["id"])
    # Simulated, the device carries the trainer's load: its memory and utilization move as it trains.
    seen, used, deadline = set(), set(), time.monotonic() + 60
    while (len(seen) < 3 or not any(u > 0 for u in used)) and time.monotonic() < deadline:
        seen.add(cell.text_content().splitlines()[0])  # its readings; the job is the second line
        used.add(float(re.search(r": ([\d.]+) [KMG]?i?B of", cell.get_attribute("title")).group(1)))
        page.wait_for_timeout(500)
    assert len(seen) >= 3, f"the held GPU's cell read {seen} for a minute"
    assert any(u > 0 for u in used), f"the held GPU showed no memory in use: {used}"
    assert any(re.search(r"util [1-9]\d*%", label) for label in seen), seen
    page.screenshot(path=str(artifacts / "cluster-training.png"), full_page=True)
    context.close()


def test_queue_shows_a_pending_job_with_its_reason_and_that_it_can_never_fit(
    browser, live, team_tokens, never_fits, artifacts
):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    page.goto("/ui#/queue")
    row = page.locator(f'#queue-table tr[data-job-id="{never_fits["id"]}"]')
    expect(row).to_have_attribute("data-never-fits", "true")
    expect(row.locator(".never")).to_have_text("can never fit")
    expect(row.locator(".position")).to_have_text("1")
    # The decider's reason, with the rule that gave it (the queue refreshes on its own).
    expect(row.locator(".reason-text")).to_contain_text("needs more devices than any schedulable node has")
    expect(row.locator(".reason .code", has_text="priority_fifo")).to_have_count(1)
    expect(row.locator(".waiting")).to_have_text(re.compile(r"^\d+(s|m \d\ds)$"))
    page.screenshot(path=str(artifacts / "queue.png"), full_page=True)
    # Another team's user does not see it in their queue.
    with httpx.Client(base_url=live.stack.api_url, headers={"Authorization": f"Bearer {team_tokens['beta']}"}) as http:
        theirs = http.get("/v1/queue")
        assert theirs.status_code == 200, theirs.text
        assert never_fits["id"] not in theirs.text
    # The same reason on the job's own page.
    row.locator("a").click()
    expect(page.locator('[data-fact="why pending"]')).to_contain_text("needs more devices")
    context.close()


def legend_value(page, chart: str, label: str) -> str:
    legend = page.locator(f"{chart} .u-legend tr.u-series", has=page.locator(".u-label", has_text=label))
    return legend.locator(".u-value").first.text_content()


def test_job_page_tails_the_log_live_with_times_eta_legend_and_smoothing(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    page.goto(f"/ui#/job/{job['id']}")
    expect(page.locator('[data-fact="status"]')).to_contain_text("running")
    log = page.locator("#log-tail")
    expect(log).not_to_be_empty()
    first = int(log.get_attribute("data-bytes"))
    deadline = time.monotonic() + 60
    while int(log.get_attribute("data-bytes")) <= first:  # live: the trainer's new lines arrive
        assert time.monotonic() < deadline, "the log tail never grew"
        page.wait_for_timeout(300)
    # The same text `adc logs` serves (the same route, the same rights).
    with alpha_client(live, team_tokens) as http:
        r = http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 3})
        assert r.status_code == 200, r.text
    expect(log).to_contain_text(r.text.splitlines()[0])

    expect(page.locator('[data-fact="started"]')).not_to_have_text("-")
    expect(page.locator('[data-fact="elapsed"]')).to_have_text(re.compile(r"^\d+(s|m \d\ds|h \d\dm)$"))
    expect(page.locator('[data-fact="step time"]')).to_have_text(re.compile(r"^[\d.e+-]+ s$"))
    expect(page.locator('[data-fact="ETA"]')).to_have_text(re.compile(r"\(at "))
    expect(page.locator("#placement-history tr.final")).to_have_count(1)

    # The legend reads the newest values, and those under the cursor on hover.
    wait_points(page, 3)
    expect(page.locator("#loss-chart .u-legend .u-series").nth(1).locator(".u-value")).to_have_text(re.compile(r"^\d"))
    box = page.locator("#loss-chart .u-over").bounding_box()
    page.mouse.move(box["x"] + 3, box["y"] + box["height"] / 2)
    step = page.locator("#loss-chart .u-legend .u-series").first.locator(".u-value")
    expect(step).to_have_text(re.compile(r"^\d+$"))
    leftmost = int(step.text_content())
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + box["height"] / 2)
    expect(step).not_to_have_text(str(leftmost))
    # The smoothed curve: off, then on.
    smooth = page.locator("#loss-chart .u-legend .u-series").nth(2)
    expect(smooth).to_have_class(re.compile("u-off"))
    page.check("#smooth-loss")
    expect(smooth).not_to_have_class(re.compile("u-off"))
    page.screenshot(path=str(artifacts / "job-page.png"), full_page=True)
    context.close()


def test_node_history_chart_holds_the_gpu_load(browser, live, team_tokens, job, artifacts):
    node, gpu = held_device(live, job)
    with alpha_client(live, team_tokens) as http:
        history = http.get(f"/v1/nodes/{node}/history").json()
        cluster = http.get("/v1/cluster/history").json()
    held = next(g for g in history["gpus"] if g["index"] == gpu)
    assert any(v and v > 0 for v in held["util_pct"]), held
    assert all(v is None for v in held["temperature_c"]), "simulated devices have no temperature sensor"
    assert any(v and v >= 1 for v in cluster["allocated"]), cluster

    context, page = sign_in(browser, live, team_tokens["alpha"])
    page.goto("/ui#/cluster")
    expect(page.locator("#cluster-chart[data-points]")).to_be_visible()
    assert int(page.locator("#cluster-chart").get_attribute("data-points")) >= 1
    allocated = page.locator("#cluster-chart .u-legend tr.u-series").nth(2).locator(".u-value")
    expect(allocated).to_have_text(re.compile(r"^[1-9]"))
    page.locator(f'.node[data-node="{node}"] .node-name a').click()
    expect(page.locator("#node-charts[data-points]")).to_be_visible()
    # The held GPU's utilization in the history chart's legend (its newest bucket): a number, not "--".
    util = page.locator("#node-util .u-legend tr.u-series").nth(gpu + 1).locator(".u-value")
    expect(util).to_have_text(re.compile(r"^\d"))
    page.screenshot(path=str(artifacts / "node-history.png"), full_page=True)
    context.close()


STREAMING = re.compile(r"/v1/(nodes/stream|jobs/stream|audit/stream)|/logs\?.*follow=true")


def open_streams(page) -> set:
    """The page's streaming requests (EventSources, log follows) that have not ended, as the
    browser's network sees them."""
    live_ones: set = set()
    page.on("request", lambda r: live_ones.add(r) if STREAMING.search(r.url) else None)
    page.on("requestfailed", lambda r: live_ones.discard(r))
    page.on("requestfinished", lambda r: live_ones.discard(r))
    return live_ones


def test_rapid_navigation_shows_each_node_once_and_closes_every_stream(browser, live, team_tokens, job, artifacts):
    context, page = sign_in(browser, live, team_tokens["alpha"])
    streams = open_streams(page)
    page.goto("/ui#/jobs")
    expect(page.locator("#jobs-table[data-loaded]")).to_be_visible()
    # The race: the cluster view opened again while its first load is still running.
    held = []
    page.route(re.compile(r"/v1/nodes(\?|$)"), lambda route: held.append(route) if not held else route.continue_())
    page.goto("/ui#/cluster")
    deadline = time.monotonic() + 30
    while not held:
        assert time.monotonic() < deadline, "the cluster view never asked for /v1/nodes"
        page.wait_for_timeout(50)
    for hop in (f"#/job/{job['id']}", "#/jobs", "#/audit", "#/cluster"):
        page.goto(f"/ui{hop}")
    expect(page.locator('.node[data-node="node-1"]')).to_have_count(1)
    held[0].continue_()  # the first load ends now, after the second drew the nodes
    page.wait_for_timeout(3000)  # its stream, had it opened one, would have drawn by now
    for node in ("node-1", "node-2"):
        expect(page.locator(f'.node[data-node="{node}"]')).to_have_count(1)
        expect(page.locator(f'.gpu[data-gpu="{node}/0"]')).to_have_count(1)
    page.screenshot(path=str(artifacts / "cluster-after-navigation.png"), full_page=True)

    # Every stream of the views left is closed: on a view with none, none is open.
    page.goto(f"/ui#/job/{job['id']}")
    expect(page.locator("#log-tail")).not_to_be_empty()
    deadline = time.monotonic() + 10
    while len(streams) != 3:  # the job page's own: audit, progress and log (the cluster's has closed)
        assert time.monotonic() < deadline, [r.url for r in streams]
        page.wait_for_timeout(200)
    page.goto("/ui#/queue")
    deadline = time.monotonic() + 10
    while streams:
        assert time.monotonic() < deadline, f"still open after leaving their views: {[r.url for r in streams]}"
        page.wait_for_timeout(200)
    context.close()


MANY = 300  # nodes beside the stack's two: many more than a screen holds


def sql_beside_the_browser(live, query: str, *args):
    """live.sql in a thread of its own: Playwright's event loop runs in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(live.sql, query, *args).result()


def test_a_long_node_list_draws_the_rows_in_view_and_the_rest_when_scrolled_to(browser, live, team_tokens, artifacts):
    """Cordoned and silent (so nothing is placed on them), listed after the stack's own nodes."""
    devices = [{"index": g, "kind": "gpu", "name": "H100", "memory_total_bytes": 80 * 2**30} for g in range(8)]
    ids = [f"zz-listed-{i:03d}" for i in range(MANY)]
    sql_beside_the_browser(
        live,
        "INSERT INTO nodes (id, devices, status, last_heartbeat) SELECT n, $2, 'cordoned', now() - interval '1 hour'"
        " FROM unnest($1::text[]) n",
        ids,
        devices,
    )
    try:
        deadline = time.monotonic() + 30
        with alpha_client(live, team_tokens) as http:  # the api re-reads the node rows every couple of seconds
            while len(http.get("/v1/nodes", params={"telemetry": "true"}).json()["items"]) < MANY + 2:
                assert time.monotonic() < deadline, "the api never listed the added nodes"
                time.sleep(0.2)
        context, page = sign_in(browser, live, team_tokens["alpha"])
        page.goto("/ui#/cluster")
        box = page.locator("#nodes[data-loaded]")
        expect(box).to_have_attribute("data-nodes", str(MANY + 2))
        expect(box).to_have_attribute("data-cells", str(8 * MANY + 4))  # the stack's nodes: 2 simulated GPUs each
        rows = page.locator("#nodes .node")
        drawn = rows.count()
        assert 2 < drawn < MANY // 2, f"{drawn} of {MANY + 2} rows in the DOM"
        expect(page.locator('.node[data-node="node-1"]')).to_have_count(1)
        expect(page.locator(f'.node[data-node="{ids[-1]}"]')).to_have_count(0)

        # The list is as long as every row: its end brings the last nodes in, each once, with its cells.
        page.mouse.wheel(0, 10**6)
        last = page.locator(f'.node[data-node="{ids[-1]}"]')
        expect(last).to_have_count(1)
        expect(last.locator(".status")).to_have_text("unreachable")
        expect(last.locator(".gpu")).to_have_count(8)
        expect(last.locator(f'.gpu[data-gpu="{ids[-1]}/7"]')).to_contain_text("free")
        assert last.bounding_box()["y"] < 900, "the last row drawn outside the window"
        expect(page.locator('.node[data-node="node-1"]')).to_have_count(0)
        assert rows.count() < MANY // 2
        page.screenshot(path=str(artifacts / "cluster-scrolled.png"))

        # Back at the top: the first rows again, once each, still live.
        page.mouse.wheel(0, -(10**6))
        expect(page.locator('.node[data-node="node-1"]')).to_have_count(1)
        expect(page.locator('.gpu[data-gpu="node-1/0"]')).to_have_count(1)
        frames = int(box.get_attribute("data-frames") or 0)
        expect(box).not_to_have_attribute("data-frames", str(frames))
        names = [n.get_attribute("data-node") for n in rows.all()]
        assert len(names) == len(set(names)) and names == sorted(names), names
        context.close()
    finally:
        sql_beside_the_browser(live, "DELETE FROM nodes WHERE id = ANY($1)", ids)
