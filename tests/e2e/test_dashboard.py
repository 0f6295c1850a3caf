"""The dashboard in a real Chromium (Debian's, headless, driven by
Playwright) against a real ``batonq serve`` on loopback.

Each test signs in as a user would, checks what the page shows against the
database, and fails on any console error. Screenshots of the pages go to
docs/img/ (shown in docs/dashboard.md).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import psycopg
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Dialog,
    Page,
    Route,
    expect,
    sync_playwright,
)
from tests.e2e.conftest import Serve
from tests.e2e.live import LiveServer, new_key
from tests.waiting import wait_for

from batonq.client_sync import Client
from batonq.errors import LeaseLost, TaskFinished

CHROMIUM = Path("/usr/bin/chromium")
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "the dashboard tests need Debian's chromium: apt-get install -y chromium"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def client(module_dsn: str) -> Iterator[Client]:
    with Client(module_dsn, listen=False).open() as opened:
        yield opened


class Console:
    """Every console error and uncaught exception of a context's pages."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def watch(self, page: Page) -> None:
        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                self.errors.append(f"{page.url}: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda error: self.errors.append(f"{page.url}: {error}"))


def sign_in(context: BrowserContext, server: LiveServer, key: str) -> Page:
    page = context.new_page()
    page.goto(f"{server.url}/")
    expect(page).to_have_url(re.compile(r"/ui/login$"))
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/ui$"))
    return page


@pytest.fixture
def console() -> Iterator[Console]:
    watched = Console()
    yield watched
    assert watched.errors == [], watched.errors


def _context(browser: Browser, console: Console, **options: object) -> Iterator[BrowserContext]:
    context = browser.new_context(**options)  # type: ignore[arg-type]
    context.on("page", console.watch)
    yield context
    context.close()


@pytest.fixture
def admin(browser: Browser, console: Console, shared_server: LiveServer) -> Iterator[Page]:
    """A page signed in with the server's first (admin) key."""
    assert shared_server.admin_key
    for context in _context(browser, console, viewport={"width": 1280, "height": 860}):
        yield sign_in(context, shared_server, shared_server.admin_key)


def shot(page: Page, name: str) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / f"dashboard-{name}.png"), full_page=True)


def row(page: Page, queue: str):  # type: ignore[no-untyped-def]
    return page.locator(f'#queue-rows tr[data-queue="{queue}"]')


def test_sign_in_keeps_the_key_in_a_strict_http_only_cookie(
    browser: Browser, console: Console, shared_server: LiveServer
) -> None:
    assert shared_server.admin_key
    for context in _context(browser, console):
        page = context.new_page()
        page.goto(f"{shared_server.url}/ui/login")
        page.get_by_label("API key").fill("bq_1_" + "0" * 64)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("invalid or revoked API key")
        shot(page, "login")
        page = sign_in(context, shared_server, shared_server.admin_key)
        [cookie] = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
        assert shared_server.admin_key not in page.url
        assert page.evaluate("document.cookie") == ""  # scripts cannot read it
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(re.compile(r"/ui/login$"))
        assert [c["name"] for c in context.cookies()] == ["batonq_login"]  # the sign-in form's token only


def test_queue_counts_match_the_database_and_follow_an_enqueue_without_a_reload(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    for i in range(4):
        client.enqueue("counts:a", {"i": i})
    client.enqueue("counts:b", {"i": 0}, held=True)
    client.enqueue("counts:b", {"i": 1}, delay_s=3600)
    [lease] = client.claim("counts:a", worker="counter")
    client.complete(lease.lease_token, {"ok": True})
    client.claim("counts:a", worker="counter")
    admin.goto(f"{shared_server.url}/ui?q=counts")
    for stats in client.queues():
        if not stats.queue.startswith("counts:"):
            continue
        line = row(admin, stats.queue)
        for state in ("pending", "leased", "scheduled", "waiting", "held", "done", "dead", "cancelled"):
            expect(line.locator(f'[data-state="{state}"]')).to_have_text(str(getattr(stats, state)))
    expect(row(admin, "counts:a").locator('[data-state="pending"]')).to_have_text("2")
    expect(admin.locator("#queue-total")).to_have_text("2")
    shot(admin, "queues")

    admin.evaluate("window.notReloaded = true")
    client.enqueue("counts:a", {"i": 99})
    client.enqueue("counts:c", {"new": True})
    expect(row(admin, "counts:a").locator('[data-state="pending"]')).to_have_text("3", timeout=WAIT_MS)
    expect(row(admin, "counts:c")).to_be_visible(timeout=WAIT_MS)
    expect(admin.get_by_role("columnheader", name="Paused")).to_have_count(0)
    client.configure_queue("counts:b", paused=True)
    expect(row(admin, "counts:b").get_by_text("paused")).to_be_visible(timeout=WAIT_MS)
    expect(admin.get_by_role("columnheader", name="Paused")).to_have_count(1)
    client.configure_queue("counts:b", paused=False)
    assert admin.evaluate("window.notReloaded") is True
    expect(row(admin, "counts:a").locator(".spark canvas")).to_have_count(1)


def test_the_task_page_shows_attempts_tokens_late_writes_and_lineage(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    root = client.enqueue("story:root", {"order": 7}, idempotency_key="order-7")
    child = client.enqueue("story:child", {"step": 2}, parent=root.task_id)
    [first] = client.claim("story:root", worker="alpha")
    client.fail(first.lease_token, {"why": "flaky"}, retry_delay_s=0)
    [second] = client.claim("story:root", worker="beta")
    client.set_stage(second.lease_token, "charging")
    client.cancel(root.task_id)
    with pytest.raises((LeaseLost, TaskFinished)):
        client.complete(second.lease_token, {"too": "late"})

    admin.goto(f"{shared_server.url}/ui/tasks/t_{root.task_id}")
    expect(admin.locator("#task-state")).to_have_text("cancelled")
    attempts = admin.locator("table.attempts tbody tr")
    expect(attempts).to_have_count(2)
    # Every attempt shows its token, worker, start, end; the failed one its error.
    for line, lease, worker in ((attempts.nth(0), first, "alpha"), (attempts.nth(1), second, "beta")):
        expect(line.locator("td").nth(1)).to_have_text(str(lease.fencing_token))
        expect(line.locator("td").nth(2)).to_have_text(worker)
        expect(line.locator("td").nth(3)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
        expect(line.locator("td").nth(4)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    expect(attempts.nth(0)).to_contain_text("flaky")
    late = admin.locator("table.late tbody tr")
    expect(late).to_have_count(1)
    expect(late.locator("td").nth(0)).to_have_text(str(second.fencing_token))
    expect(late.locator("td").nth(1)).to_contain_text("beta")  # who held that lease
    expect(late).to_contain_text("complete")
    expect(admin.get_by_text("Children:")).to_be_visible()
    shot(admin, "task")
    admin.locator("section", has=admin.locator("#lineage-h")).get_by_role(
        "link", name=f"t_{child.task_id}", exact=True
    ).first.click()
    expect(admin).to_have_url(re.compile(rf"/ui/tasks/t_{child.task_id}$"))
    expect(admin.get_by_text(f"t_{root.task_id}").first).to_be_visible()
    expect(admin.locator("svg.tree rect")).to_have_count(2)


def test_a_dead_task_is_retried_in_three_clicks(admin: Page, client: Client) -> None:
    task = client.enqueue("deadly:q", {"n": 1})
    [lease] = client.claim("deadly:q", worker="gamma")
    client.fail(lease.lease_token, "card declined", requeue=False)
    admin.on("dialog", lambda dialog: dialog.accept())

    admin.get_by_role("link", name="Dead letters").click()  # 1
    shot(admin, "dead")
    admin.get_by_role("button", name=f"Retry t_{task.task_id}").click()  # 2, 3: confirm
    expect(admin).to_have_url(re.compile(rf"/ui/tasks/t_{task.task_id}$"))
    expect(admin.locator("#task-state")).to_have_text("pending")
    expect(admin.get_by_role("status")).to_have_text(f"t_{task.task_id} is pending now.")
    assert client.task(task.task_id).state == "pending"
    admin.reload()  # the result was said once; a reload shows the page alone
    expect(admin.locator("#task-state")).to_have_text("pending")
    expect(admin.get_by_role("status")).to_have_count(0)

    # The task page's own button answers in place, and says what happened.
    admin.get_by_role("button", name="Hold").click()
    expect(admin.get_by_role("status")).to_have_text(f"t_{task.task_id} is held now.")
    expect(admin.locator("#task-state")).to_have_text("held")
    assert client.task(task.task_id).state == "held"


def test_bulk_retry_retries_the_filtered_set_only(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    doomed = []
    cases = (("bulk:a", "timeout"), ("bulk:a", "timeout"), ("bulk:a", "bad input"), ("bulk:b", "timeout"))
    for queue, error in cases:
        enqueued = client.enqueue(queue, {"q": queue})
        [lease] = client.claim(queue)
        client.fail(lease.lease_token, error, requeue=False)
        doomed.append(enqueued.task_id)
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.goto(f"{shared_server.url}/ui/dead?queue=bulk:a&error=timeout")
    expect(admin.locator("table.dead tbody tr")).to_have_count(2)
    admin.get_by_role("button", name="Retry all these dead tasks").click()
    expect(admin.get_by_role("status")).to_contain_text("Retried 2 dead tasks")
    assert [client.task(t).state for t in doomed] == ["pending", "pending", "dead", "dead"]


def test_graph_and_workers_pages(admin: Page, client: Client) -> None:
    client.add_edge("flow:in", "flow:split", map="/order")
    client.add_edge("flow:split", "flow:each", fan_out="/items")
    client.add_edge("flow:each", "flow:joined", join=True)
    client.add_edge("flow:in", "flow:alerts", when="/urgent", equals=True)
    for i in range(3):
        client.enqueue("flow:in", {"i": i})
    [lease] = client.claim("flow:in", worker="delta")
    client.complete(lease.lease_token, {"order": {"n": 1}, "urgent": False})

    admin.get_by_role("link", name="Graph").click()
    for label in ("map /order", "fan_out /items", "join", "when /urgent = true"):
        expect(admin.locator("svg.qgraph text.label", has_text=label)).to_have_count(1)
    expect(admin.locator("svg.qgraph rect.qnode")).to_have_count(5)
    expect(admin.locator("svg.qgraph a[aria-label^='flow:in'] rect")).to_have_class(re.compile(r"\bsome\b"))
    shot(admin, "graph")
    admin.locator("svg.qgraph a[aria-label^='flow:in']").click()
    expect(admin).to_have_url(re.compile(r"/ui/tasks\?queue=flow%3Ain$|/ui/tasks\?queue=flow:in$"))
    expect(admin.locator("table.tasks tbody tr")).to_have_count(3)
    shot(admin, "tasks")

    admin.get_by_role("link", name="Workers").click()
    delta = admin.get_by_role("rowheader", name="delta", exact=True)
    line = admin.locator("table.workers tbody tr", has=delta)
    expect(line).to_have_count(1)
    expect(line.locator("td").nth(0)).to_have_text("1")  # done
    shot(admin, "workers")


def test_an_observer_key_sees_its_scope_only_and_gets_no_action_buttons(
    browser: Browser, console: Console, shared_server: LiveServer, client: Client
) -> None:
    assert shared_server.admin_key
    with shared_server.http(shared_server.admin_key) as http:
        _, key = new_key(http, 3, ["obs:*"])
    mine = client.enqueue("obs:mine", {"n": 1})
    [lease] = client.claim("obs:mine")
    client.fail(lease.lease_token, "broken", requeue=False)
    theirs = client.enqueue("secret:theirs", {"n": 2})

    for context in _context(browser, console):
        page = sign_in(context, shared_server, key)
        expect(row(page, "obs:mine")).to_be_visible()
        expect(page.locator("#queue-rows tbody tr")).to_have_count(1)
        page.get_by_role("link", name="Dead letters").click()
        expect(page.locator("table.dead tbody tr")).to_have_count(1)
        expect(page.get_by_role("button", name=re.compile("Retry"))).to_have_count(0)
        page.get_by_role("link", name=f"t_{mine.task_id}").click()
        expect(page.locator("#task-state")).to_have_text("dead")
        expect(page.locator(".actions button")).to_have_count(0)
        shot(page, "observer")

        hidden = context.request.get(f"{shared_server.url}/ui/tasks/t_{theirs.task_id}")
        assert hidden.status == 404 and f"task t_{theirs.task_id} not found" in hidden.text()

        # A forged action, even with the right CSRF token, is refused.
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        forged = context.request.post(
            f"{shared_server.url}/ui/tasks/t_{mine.task_id}/retry", form={"csrf": csrf or ""}
        )
        assert forged.status == 403
        assert "ring 1 (operator)" in forged.text()
        assert client.task(mine.task_id).state == "dead"


def test_every_action_needs_the_csrf_token(admin: Page, client: Client, shared_server: LiveServer) -> None:
    task = client.enqueue("csrf:q", {"n": 1})
    [lease] = client.claim("csrf:q")
    client.fail(lease.lease_token, "x", requeue=False)
    url = f"{shared_server.url}/ui/tasks/t_{task.task_id}/retry"
    request = admin.context.request
    assert request.post(url).status == 403
    assert request.post(url, form={"csrf": "0" * 64}).status == 403
    assert request.post(f"{shared_server.url}/ui/dead/retry", form={"queue": "csrf:q"}).status == 403
    assert request.post(f"{shared_server.url}/ui/logout").status == 403
    assert client.task(task.task_id).state == "dead"
    admin.goto(f"{shared_server.url}/ui/tasks/t_{task.task_id}")
    csrf = admin.locator("input[name=csrf]").first.get_attribute("value")
    assert request.post(url, form={"csrf": csrf or ""}, max_redirects=0).status == 303
    assert client.task(task.task_id).state == "pending"
    # Without the session cookie, a token alone does nothing.
    with httpx.Client() as stranger:
        assert stranger.post(url, data={"csrf": csrf or ""}).status_code == 401


def test_the_sign_in_form_needs_its_csrf_token(shared_server: LiveServer) -> None:
    """Another site cannot sign a browser in with a key of its choosing."""
    key = shared_server.admin_key or ""
    login = f"{shared_server.url}/ui/login"
    with httpx.Client() as forger:  # a cross-site form: no token, or not the browser's
        for form in ({"key": key}, {"key": key, "csrf": "0" * 43}):
            refused = forger.post(login, data=form)
            assert refused.status_code == 403 and "out of date" in refused.text
            assert "batonq_session" not in refused.cookies
    with httpx.Client() as browser_like:
        page = browser_like.get(login)
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token and browser_like.cookies.get("batonq_login") == token[1]
        signed_in = browser_like.post(login, data={"key": key, "csrf": token[1]})
        assert signed_in.status_code == 303 and signed_in.cookies.get("batonq_session")
        assert key not in signed_in.headers.get("set-cookie", "")  # a session's token, never the key


def _sign_in(browser_like: httpx.Client, key: str) -> None:
    """Sign a cookie-keeping client in to the dashboard with ``key``."""
    token = re.search(r'name="csrf" value="([^"]+)"', browser_like.get("/ui/login").text)
    assert token
    assert browser_like.post("/ui/login", data={"key": key, "csrf": token[1]}).status_code == 303


def test_a_copied_cookie_is_no_api_key_and_signing_out_ends_it_everywhere(
    shared_server: LiveServer, client: Client
) -> None:
    made = client.create_key(3, ["*"], "copied")
    url = shared_server.url
    with httpx.Client(base_url=url) as browser_like, httpx.Client(base_url=url) as thief:
        _sign_in(browser_like, made.key)
        cookie = browser_like.cookies["batonq_session"]
        thief.cookies.set("batonq_session", cookie)
        assert thief.get("/ui").status_code == 200  # a copy works while the session lives
        bearer = thief.get("/v1/queues", headers={"Authorization": f"Bearer {cookie}"})
        assert bearer.status_code == 401
        csrf = re.search(r'name="csrf" value="([^"]+)"', browser_like.get("/ui").text)
        assert csrf
        signed_out = browser_like.post("/ui/logout", data={"csrf": csrf[1]})
        assert signed_out.status_code == 303 and signed_out.headers["location"] == "/ui/login"
        refused = thief.get("/ui")
        assert refused.status_code == 303 and refused.headers["location"] == "/ui/login"


def test_revoking_a_key_signs_its_sessions_out(shared_server: LiveServer, client: Client) -> None:
    made = client.create_key(1, ["*"], "to revoke")
    with httpx.Client(base_url=shared_server.url) as browser_like:
        _sign_in(browser_like, made.key)
        assert browser_like.get("/ui").status_code == 200
        client.revoke_key(made.id)
        refused = browser_like.get("/ui")
        assert refused.status_code == 303 and refused.headers["location"] == "/ui/login"


def test_a_form_on_another_site_cannot_sign_the_user_out(admin: Page, shared_server: LiveServer) -> None:
    """The session cookie is SameSite=Strict: another site's form posts
    without it, and signing out needs the session and its CSRF token."""
    admin.context.route("http://elsewhere.test/**", lambda route: route.fulfill(
        content_type="text/html",
        body=f'<form method="post" action="{shared_server.url}/ui/logout"></form>'
             "<script>document.forms[0].submit()</script>",
    ))  # fmt: skip
    admin.goto("http://elsewhere.test/")
    expect(admin).to_have_url(re.compile(r"/ui/login$"))  # where the form landed
    admin.goto(f"{shared_server.url}/ui")
    expect(admin).to_have_url(re.compile(r"/ui$"))  # still signed in
    expect(admin.get_by_role("button", name="Sign out")).to_be_visible()


def test_failed_sign_ins_and_bad_api_keys_count_against_one_limit(serve: Serve) -> None:
    """100 failed key checks from an address in a minute, at either door,
    and both refuse it (429) for a while, even with a valid key."""
    server = serve()
    key = server.admin_key or ""
    with httpx.Client(base_url=server.url) as browser_like, server.http() as api:
        token = re.search(r'name="csrf" value="([^"]+)"', browser_like.get("/ui/login").text)
        assert token
        for i in range(60):
            wrong = browser_like.post("/ui/login", data={"key": f"bq_1_{i:064x}", "csrf": token[1]})
            assert wrong.status_code == 200 and "invalid or revoked API key" in wrong.text
        for i in range(40):
            bad = api.get("/v1/queues", headers={"Authorization": f"Bearer bq_1_{i:064x}"})
            assert bad.status_code == 401
        assert api.get("/v1/queues", headers={"Authorization": f"Bearer {key}"}).status_code == 429
        throttled = browser_like.post("/ui/login", data={"key": key, "csrf": token[1]})
        assert throttled.status_code == 429 and "too many failed authentications" in throttled.text
        assert int(throttled.headers["retry-after"]) > 0
        assert "batonq_session" not in throttled.cookies


def test_ten_thousand_queues_page_and_search_fast(
    admin: Page, module_dsn: str, shared_server: LiveServer
) -> None:
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO batonq.queues (name) SELECT 'zz-many:' || lpad(i::text, 5, '0')"
            " FROM generate_series(1, 10000) i"
        )
    started = time.monotonic()
    admin.goto(f"{shared_server.url}/ui?q=zz-many")
    expect(admin.locator("#queue-total")).to_have_text("10000")
    expect(admin.locator("#queue-rows tbody tr")).to_have_count(50)
    admin.get_by_role("link", name="Next page").click()
    expect(row(admin, "zz-many:00051")).to_be_visible()
    admin.get_by_label("Find a queue").fill("zz-many:0999")
    expect(admin.locator("#queue-rows tbody tr")).to_have_count(10)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"three pages of 10,000 queues took {elapsed:.1f} s"
    with httpx.Client(base_url=shared_server.url) as http:
        _sign_in(http, shared_server.admin_key or "")
        timings = []
        for _ in range(5):
            began = time.monotonic()
            assert http.get("/ui/queues/rows?q=zz-many").status_code == 200
            timings.append(time.monotonic() - began)
    assert min(timings) < 1.0, timings


def test_a_phone_in_dark_mode_reads_the_queues(
    browser: Browser, console: Console, shared_server: LiveServer
) -> None:
    assert shared_server.admin_key
    options = {"viewport": {"width": 390, "height": 844}, "color_scheme": "dark", "is_mobile": True}
    for context in _context(browser, console, **options):
        page = sign_in(context, shared_server, shared_server.admin_key)
        page.goto(f"{shared_server.url}/ui?q=counts")
        expect(page.get_by_role("link", name="Dead letters")).to_be_visible()
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(21, 23, 26)", background
        shot(page, "phone-dark")
        # Keyboard: the skip link comes first and leads to the content.
        page.keyboard.press("Tab")
        expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
        page.keyboard.press("Enter")
        page.keyboard.press("Tab")  # from the content: the first control of the page
        expect(page.get_by_label("Find a queue")).to_be_focused()


def test_the_api_docs_render_with_nothing_from_outside(
    browser: Browser, console: Console, shared_server: LiveServer
) -> None:
    """/docs (Swagger UI) loads its script and style from the service: it
    renders with every request to another host refused (offline, a strict proxy)."""
    with browser.new_context() as context:
        outside: list[str] = []

        def only_the_service(route: Route) -> None:
            if route.request.url.startswith(shared_server.url):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        context.route("**/*", only_the_service)
        page = context.new_page()
        console.watch(page)
        page.goto(f"{shared_server.url}/docs")
        expect(page.get_by_text("/v1/enqueue").first).to_be_visible(timeout=WAIT_MS)
        assert outside == []


TRACE = (
    "ValueError: card <script>alert(1)</script> declined\n\n"
    "Traceback (most recent call last):\n"
    '  File "app.py", line 9, in charge\n'
    '    raise ValueError("card declined")\n'
    "ValueError: card <script>alert(1)</script> declined"
)


def test_errors_read_as_text_with_their_lines_and_a_trace_to_open(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    """An error as the worker writes it (message, blank line, traceback):
    the task page keeps its lines; the attempts and the dead letters show the
    message as text, the trace folded away."""
    task = client.enqueue("errors:q", {"n": 1})
    [lease] = client.claim("errors:q", worker="delta")
    client.fail(lease.lease_token, TRACE, requeue=False)

    admin.goto(f"{shared_server.url}/ui/tasks/t_{task.task_id}")
    expect(admin.locator("#last-error")).to_have_text(TRACE)  # every line, markup as text
    cell = admin.locator("table.attempts tbody tr td").nth(6)
    expect(cell.locator("span.error")).to_have_text("ValueError: card <script>alert(1)</script> declined")
    expect(cell.locator("details pre")).not_to_be_visible()
    cell.locator("summary").click()
    expect(cell.locator("details pre")).to_have_text(TRACE.partition("\n\n")[2])
    assert '"' not in (cell.locator("span.error").text_content() or "")

    admin.goto(f"{shared_server.url}/ui/dead?queue=errors:q")
    row = admin.locator("table.dead tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("span.error")).to_have_text("ValueError: card <script>alert(1)</script> declined")
    expect(row.locator("details pre")).not_to_be_visible()
    box = row.bounding_box()
    assert box is not None and box["height"] < 80, box  # one line, not a 20-line row


def test_an_action_on_the_task_page_moves_the_run_tree_too(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    task = client.enqueue("tree:q", {"n": 1})
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.goto(f"{shared_server.url}/ui/tasks/t_{task.task_id}")
    node = admin.locator("svg.tree text").first
    expect(node).to_have_text(f"t_{task.task_id} · pending")
    admin.get_by_role("button", name="Hold").click()
    expect(admin.locator("#task-state")).to_have_text("held")
    expect(node).to_have_text(f"t_{task.task_id} · held")  # no reload
    admin.get_by_role("button", name="Release").click()
    expect(admin.locator("#task-state")).to_have_text("pending")
    expect(admin.locator("svg.tree text").first).to_have_text(f"t_{task.task_id} · pending")


def test_the_schedules_page_shows_next_ticks_and_firings_and_acts_on_them(
    admin: Page, client: Client, shared_server: LiveServer, browser: Browser, console: Console
) -> None:
    client.add_schedule("sched:nightly", "0 3 * * *", "sched:reports", {"kind": "daily"}, tz="Europe/Berlin")
    client.add_schedule("sched:tick", "* * * * * *", "sched:ticks", {"n": 1})
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.goto(f"{shared_server.url}/ui")
    admin.get_by_role("link", name="Schedules").click()
    nightly = admin.locator('tr[data-schedule="sched:nightly"]')
    expect(nightly.locator("td").nth(1)).to_have_text("Europe/Berlin")
    # 03:00 in Berlin, in UTC: 01:00 in summer, 02:00 in winter, one a day.
    ticks = nightly.locator("td.ticks time")
    expect(ticks).to_have_count(3)
    moments = [datetime.fromisoformat(t or "") for t in ticks.evaluate_all("els => els.map(e => e.dateTime)")]
    assert all(m.astimezone(ZoneInfo("Europe/Berlin")).hour == 3 for m in moments), moments
    gaps = {b - a for a, b in itertools.pairwise(moments)}
    assert gaps <= {timedelta(hours=23), timedelta(hours=24), timedelta(hours=25)}, moments
    # The every-second schedule fires (the server's sweeper leads): its firings show once reloaded.
    tick = admin.locator('tr[data-schedule="sched:tick"] td.firings a')

    def fired() -> bool:
        admin.reload()
        return tick.count() > 0

    wait_for(fired, timeout=20, what="a firing of sched:tick")
    task_id = int((tick.first.text_content() or "").removeprefix("t_"))
    assert client.task(task_id).queue == "sched:ticks"
    shot(admin, "schedules")

    nightly.get_by_role("button", name="Pause").click()
    expect(admin.get_by_role("status")).to_have_text("Paused schedule sched:nightly.")
    expect(nightly.locator(".badge.held")).to_have_text("paused")
    expect(nightly.locator("td.ticks")).to_have_text("—")
    paused = client.schedule("sched:nightly")
    assert paused is not None and paused.paused
    [entry] = client.settings_audit(kind="schedule", name="sched:nightly", limit=1)
    admin_id = int((shared_server.admin_key or "").split("_")[1])
    assert entry.actor == f"key:{admin_id}" and entry.after is not None and entry.after["paused"] is True
    nightly.get_by_role("button", name="Resume").click()
    expect(admin.get_by_role("status")).to_have_text("Resumed schedule sched:nightly.")
    assert not client.schedule("sched:nightly").paused  # type: ignore[union-attr]

    nightly.get_by_role("button", name="Run now").click()
    expect(admin.get_by_role("status")).to_have_text("Ran schedule sched:nightly.")
    [ran] = client.find_tasks("sched:reports")
    assert ran.payload == {"kind": "daily"} and ran.state == "pending"
    admin.locator('tr[data-schedule="sched:tick"]').get_by_role("button", name="Remove").click()
    expect(admin.get_by_role("status")).to_have_text("Removed schedule sched:tick.")
    expect(admin.locator('tr[data-schedule="sched:tick"]')).to_have_count(0)
    assert client.schedule("sched:tick") is None

    # An operator pauses but may not remove; one of other queues sees none
    # and may not touch it.
    url = f"{shared_server.url}/ui/schedules/sched:nightly"
    with shared_server.http(shared_server.admin_key or "") as http:
        _, operator = new_key(http, 1, ["sched:*"])
        _, stranger = new_key(http, 1, ["elsewhere:*"])
    for context in _context(browser, console):
        page = sign_in(context, shared_server, operator)
        page.goto(f"{shared_server.url}/ui/schedules")
        row_ = page.locator('tr[data-schedule="sched:nightly"]')
        expect(row_.get_by_role("button", name="Pause")).to_be_visible()
        expect(row_.get_by_role("button", name="Remove")).to_have_count(0)
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        forged = context.request.post(f"{url}/remove", form={"csrf": csrf or ""})
        assert forged.status == 403 and "ring 0 (admin)" in forged.text()
        assert client.schedule("sched:nightly") is not None
    for context in _context(browser, console):
        page = sign_in(context, shared_server, stranger)
        page.goto(f"{shared_server.url}/ui/schedules")
        expect(page.locator("table.schedules tbody tr")).to_have_text(re.compile("No schedules"))
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        hidden = context.request.post(f"{url}/pause", form={"csrf": csrf or ""})
        assert hidden.status == 404 and "schedule sched:nightly does not exist" in hidden.text()
        assert not client.schedule("sched:nightly").paused  # type: ignore[union-attr]
    client.remove_schedule("sched:nightly")


def test_a_queues_settings_page_pauses_edits_limits_and_shows_the_audit(
    admin: Page, client: Client, shared_server: LiveServer, browser: Browser, console: Console
) -> None:
    client.enqueue("settings:q", {"n": 1})
    admin.on("dialog", lambda dialog: dialog.accept())
    admin.goto(f"{shared_server.url}/ui/tasks?queue=settings:q")
    admin.get_by_role("link", name="Settings").click()
    expect(admin.get_by_role("heading", level=1)).to_have_text("Settings of settings:q")

    admin.get_by_role("button", name="Pause queue").click()
    expect(admin.get_by_role("status")).to_have_text("Paused settings:q.")
    expect(admin.locator("h1 .badge")).to_have_text("paused")
    assert client.queue_configs(["settings:q"])[0].paused
    assert client.claim("settings:q") == []

    admin.get_by_label("Max leased", exact=True).fill("3")
    admin.get_by_label("Retention (s)").fill("3600")
    admin.get_by_role("button", name="Save").click()
    expect(admin.get_by_role("status")).to_have_text("Saved settings:q.")
    config = client.queue_configs(["settings:q"])[0]
    assert (config.max_leased, config.retention_s, config.paused) == (3, 3600, True)
    expect(admin.locator("p.meta")).to_contain_text("Limits: at most 3 leased")
    admin_id = int((shared_server.admin_key or "").split("_")[1])
    changes = admin.locator("table.audit tbody tr")
    expect(changes.first).to_contain_text(f"key:{admin_id}")
    expect(changes.first).to_contain_text("max_leased: null → 3")
    expect(changes.first).to_contain_text("retention_s")
    expect(changes.nth(1)).to_contain_text("paused: false → true")
    shot(admin, "settings")

    # Checked as the API checks a PATCH: a bad value changes nothing.
    admin.get_by_label("Lease (s)").fill("0")
    admin.get_by_label("Max leased", exact=True).fill("0")
    admin.get_by_role("button", name="Save").click()
    expect(admin.get_by_role("alert")).to_have_text("Lease (s): must be between 1 and 3600 (got 0)")
    assert client.queue_configs(["settings:q"])[0].max_leased == 3
    expect(admin.get_by_label("Max leased", exact=True)).to_have_value("0")  # kept to correct
    admin.get_by_label("Lease (s)").fill("")
    admin.get_by_role("button", name="Save").click()  # 0 removes the limit
    expect(admin.get_by_role("status")).to_have_text("Saved settings:q.")
    assert client.queue_configs(["settings:q"])[0].max_leased is None
    admin.get_by_role("button", name="Resume queue").click()
    expect(admin.locator("h1 .badge")).to_have_count(0)
    assert not client.queue_configs(["settings:q"])[0].paused

    # An operator reads them but may not change them; another scope sees no such queue.
    with shared_server.http(shared_server.admin_key or "") as http:
        _, operator = new_key(http, 1, ["settings:*"])
        _, stranger = new_key(http, 0, ["elsewhere:*"])
    url = f"{shared_server.url}/ui/queues/settings:q/settings"
    for context in _context(browser, console):
        page = sign_in(context, shared_server, operator)
        page.goto(url)
        expect(page.get_by_label("Max leased", exact=True)).to_be_disabled()
        expect(page.get_by_role("button", name="Pause queue")).to_have_count(0)
        csrf = page.locator("header input[name=csrf]").get_attribute("value")
        forged = context.request.post(url, form={"csrf": csrf or "", "paused": "true"})
        assert forged.status == 403 and "ring 0 (admin)" in forged.text()
    for context in _context(browser, console):
        page = sign_in(context, shared_server, stranger)
        assert context.request.get(url).status == 404
        csrf = page.locator("header input[name=csrf]").get_attribute("value")
        hidden = context.request.post(url, form={"csrf": csrf or "", "paused": "true"})
        assert hidden.status == 404
    assert not client.queue_configs(["settings:q"])[0].paused


def test_a_task_not_due_yet_shows_as_scheduled_and_filters_so(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    later = client.enqueue("when:q", {"n": 1}, delay_s=7200)
    due = client.enqueue("when:q", {"n": 2})
    admin.goto(f"{shared_server.url}/ui/tasks?queue=when:q")
    rows = admin.locator("table.tasks tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator(".badge")).to_have_text("pending")
    expect(rows.nth(1).locator(".badge")).to_have_text("scheduled")
    expect(rows.nth(1)).to_contain_text("1h 59m")  # runs in
    admin.get_by_label("State").select_option("scheduled")
    admin.get_by_role("button", name="Show").click()
    expect(rows).to_have_count(1)
    expect(rows.first.get_by_role("link")).to_have_text(f"t_{later.task_id}")
    rows.first.get_by_role("link").click()
    expect(admin.locator("#task-state")).to_have_text("pending")
    expect(admin.locator("dl.facts")).to_contain_text("(scheduled: in 1h 59m)")
    assert client.task(due.task_id).state == "pending"


def test_a_task_list_and_a_task_page_follow_the_task_without_a_reload(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    first = client.enqueue("live:q", {"n": 1})
    admin.goto(f"{shared_server.url}/ui/tasks?queue=live:q")
    rows = admin.locator("#task-rows table.tasks tbody tr")
    expect(rows).to_have_count(1)
    second = client.enqueue("live:q", {"n": 2})
    expect(rows).to_have_count(2)  # no reload
    expect(rows.first.get_by_role("link")).to_have_text(f"t_{second.task_id}")

    admin.goto(f"{shared_server.url}/ui/tasks/t_{first.task_id}")
    expect(admin.locator("#task-state")).to_have_text("pending")
    [lease] = client.claim("live:q", worker="w-live", lease_s=600)
    assert lease.task_id == first.task_id
    expect(admin.locator("#task-state")).to_have_text("leased")
    expect(admin.locator("dl.facts")).to_contain_text("w-live")
    expect(admin.locator("dl.facts")).to_contain_text(re.compile(r"Lease left\s*9m \d+s"))
    client.complete(lease.lease_token, {"ok": True})
    expect(admin.locator("#task-state")).to_have_text("done")
    expect(admin.locator("#task-live")).not_to_have_class(re.compile("live"))  # finished: no more polls
    expect(admin.locator("#task-live")).to_contain_text('"ok": true')


def test_tasks_are_ticked_and_acted_on_together_with_a_count_to_confirm(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    first, second, third = (client.enqueue("bulk:q", {"n": n}) for n in range(3))
    asked: list[str] = []

    def confirm(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    admin.on("dialog", confirm)
    admin.goto(f"{shared_server.url}/ui/tasks?queue=bulk:q")
    admin.get_by_label(f"Tick t_{first.task_id}").check()
    admin.get_by_label(f"Tick t_{third.task_id}").check()
    admin.locator("#select").get_by_role("button", name="Hold").click()
    expect(admin.get_by_role("status")).to_have_text("Held 2 tasks.")
    assert asked == ["Hold 2 tasks?"]
    assert [client.task(t.task_id).state for t in (first, second, third)] == ["held", "pending", "held"]
    shot(admin, "select")

    # Every task the list shows: the one that cannot be released is named.
    admin.get_by_label("every task this list shows").check()
    admin.locator("#select").get_by_role("button", name="Release").click()
    expect(admin.get_by_role("status")).to_contain_text("Released 2 tasks. 1 could not be (")
    assert asked[-1] == "Release every task this list shows?"
    assert [client.task(t.task_id).state for t in (first, second, third)] == ["pending"] * 3

    # The page's box ticks them all; a cancel then ends every one.
    admin.get_by_label("Tick every task on this page").check()
    admin.locator("#select").get_by_role("button", name="Cancel").click()
    expect(admin.get_by_role("status")).to_have_text("Cancelled 3 tasks.")
    assert asked[-1] == "Cancel 3 tasks?"
    assert {client.task(t.task_id).state for t in (first, second, third)} == {"cancelled"}


def test_a_task_is_found_by_id_or_key_in_any_queue_the_key_sees(
    admin: Page, client: Client, shared_server: LiveServer, browser: Browser, console: Console
) -> None:
    shop = client.enqueue("find:shop", {"n": 1}, idempotency_key="order-9")
    mail = client.enqueue("find:mail", {"n": 2}, idempotency_key="order-9")
    hidden = client.enqueue("other:secret", {"n": 3}, idempotency_key="order-9")
    admin.goto(f"{shared_server.url}/ui/tasks")
    admin.get_by_label("Find a task in any queue").fill(f"t_{shop.task_id}")
    admin.get_by_role("button", name="Find").click()
    expect(admin).to_have_url(re.compile(rf"/ui/tasks/t_{shop.task_id}$"))

    admin.goto(f"{shared_server.url}/ui/find?q=order-9")
    links = admin.locator("table.found tbody th a")
    expect(links).to_have_text([f"t_{hidden.task_id}", f"t_{mail.task_id}", f"t_{shop.task_id}"])
    with shared_server.http(shared_server.admin_key or "") as http:
        _, observer = new_key(http, 3, ["find:*"])
    for context in _context(browser, console):
        page = sign_in(context, shared_server, observer)
        page.goto(f"{shared_server.url}/ui/find?q=order-9")
        expect(page.locator("table.found tbody th a")).to_have_text(
            [f"t_{mail.task_id}", f"t_{shop.task_id}"]
        )
        page.goto(f"{shared_server.url}/ui/find?q=t_{hidden.task_id}")  # not its queue: not found
        expect(page.locator("table.found tbody")).to_contain_text(
            f"No task has id or idempotency key “t_{hidden.task_id}”"
        )


def test_the_dead_letters_follow_new_deaths_without_a_reload(
    admin: Page, client: Client, shared_server: LiveServer
) -> None:
    admin.goto(f"{shared_server.url}/ui/dead?queue=dying:q")
    rows = admin.locator("#dead-rows table.dead tbody tr")
    expect(rows).to_have_text(["No dead tasks match."])
    task = client.enqueue("dying:q", {"n": 1})
    [lease] = client.claim("dying:q")
    client.fail(lease.lease_token, "gone for good", requeue=False)
    expect(rows.first.get_by_role("link").first).to_have_text(f"t_{task.task_id}")  # no reload
    expect(rows.first).to_contain_text("gone for good")
