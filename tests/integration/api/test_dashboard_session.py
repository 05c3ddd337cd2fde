"""The dashboard's session: a token sent once in a header becomes an HttpOnly, SameSite=Strict
cookie that reads like the token but can change nothing; the page and its assets are public."""

from __future__ import annotations


def test_sign_in_sets_an_httponly_strict_cookie_for_reads_only(api):
    with api.client(None) as anonymous:
        assert anonymous.post("/ui/session", headers={"Authorization": "Bearer adc_not-a-token"}).status_code == 401
        r = anonymous.post("/ui/session", headers={"Authorization": f"Bearer {api.tokens.user}"})
        assert r.status_code == 204
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("adc_session=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Path=/" in cookie
        # The client now holds the cookie: reads work as the token's own principal ...
        me = anonymous.get("/v1/me")
        assert me.status_code == 200 and me.json()["team"] == "alpha"
        assert anonymous.get("/v1/jobs").status_code == 200
        # ... and nothing that changes state does.
        assert anonymous.post("/v1/jobs", json=api.job_spec()).status_code == 401
        assert anonymous.post("/ui/logout").status_code == 204
        assert anonymous.get("/v1/me").status_code == 401


def test_the_page_and_its_assets_are_public_and_hold_no_data(api):
    with api.client(None) as anonymous:
        page = anonymous.get("/ui")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "default-src 'self'" in page.headers["content-security-policy"]
        script = anonymous.get("/ui/static/vendor/uplot/uPlot.iife.min.js")
        assert script.status_code == 200 and "uPlot" in script.text
        assert anonymous.get("/ui/static/app.js").status_code == 200
        assert anonymous.get("/ui/static/../../v1/jobs").status_code in (401, 404)  # no way around the gate


def test_the_assets_are_revalidated_on_every_load_and_the_page_names_its_icon(api):
    with api.client(None) as anonymous:
        script = anonymous.get("/ui/static/app.js")
        assert script.headers["cache-control"] == "no-cache" and script.headers["etag"]
        again = anonymous.get("/ui/static/app.js", headers={"If-None-Match": script.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        # The icon is inline (the page's CSP allows data: images), so no request for /favicon.ico.
        assert '<link rel="icon" href="data:image/svg+xml,' in anonymous.get("/ui").text
