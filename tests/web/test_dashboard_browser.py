"""The dashboard in a real browser: Debian's chromium driven by Playwright against a real
``awa-fast serve`` process and a real database seeded by a real worker. Clicks through every
page and every admin action and checks the database rows after each action. A missing chromium
is a failure, never a skip (.ci/run installs it)."""

from __future__ import annotations

import psycopg
import pytest
from playwright.async_api import async_playwright, expect

from tests.dashboard_seed import seed
from tests.dashboard_support import CHROMIUM, CHROMIUM_ARGS, served

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def ids(dsn):
    return await seed(dsn)


@pytest.fixture(scope="module")
async def browser():
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser):
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    p = await context.new_page()
    p.on("dialog", lambda dialog: dialog.accept())  # the confirm() of destructive actions
    yield p
    await context.close()


@pytest.fixture(scope="module")
def base_url(dsn, ids):
    with served(dsn) as url:
        yield url


def db(dsn: str, query: str, params=None):
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchone()


async def test_click_through_every_page(page, base_url, ids):
    await page.goto(base_url + "/")
    await expect(page).to_have_url(base_url + "/queues")
    for queue in ("default", "shipping", "billing"):
        await expect(page.locator(f'tr[data-queue="{queue}"]')).to_be_visible()

    # jobs: filter by state through the form, then open the failed job
    await page.click("header nav >> text=Jobs")
    await page.select_option("select[name=state]", "failed")
    await page.click("form.filters button")
    await expect(page.locator(f'tr[data-id="{ids["boom"]}"]')).to_be_visible()
    await expect(page.locator(f'tr[data-id="{ids["order"]}"]')).to_have_count(0)
    await page.click(f'tr[data-id="{ids["boom"]}"] a')
    await expect(page.locator("#errors")).to_contain_text(
        "TerminalError: invoice template missing for order 1001"
    )
    await expect(page.locator("#errors pre.trace")).to_contain_text("Traceback")
    await expect(page.locator("#progress")).to_contain_text("rendering invoice")

    # lineage: the order's follow-up, and back to the order through "Staged by"
    await page.goto(f"{base_url}/jobs/{ids['order']}")
    await page.click(f'#children a[href="/jobs/{ids["ship"]}"]')
    await expect(page).to_have_url(f"{base_url}/jobs/{ids['ship']}")
    await expect(page.locator("#metadata")).to_contain_text("awa:triggered_by")
    await page.click(f'#lineage a[href="/jobs/{ids["order"]}"]')
    await expect(page.locator("h1")).to_contain_text(f"Job #{ids['order']}")

    await page.click("header nav >> text=DLQ")
    await expect(page.locator(f'#dlq tr[data-id="{ids["dead"]}"]')).to_contain_text("send_invoice")
    await page.click("header nav >> text=Consequences")
    await expect(page.locator("#owed-count")).to_have_text("1")
    await expect(page.locator(f'#owed tr[data-id="{ids["charge"]}"]')).to_contain_text(
        "stock service unreachable"
    )
    await expect(page.locator(f'#applied tr[data-id="{ids["refund"]}"]')).to_be_visible()
    await page.click("header nav >> text=Cron")
    await expect(page.locator('tr[data-name="nightly-report"]')).to_contain_text("0 3 * * *")
    await page.click("header nav >> text=Workers")
    await expect(page.locator("#leader")).to_contain_text("No process holds the leader lock")
    await expect(page.locator("#connections")).to_be_visible()

    # bad input: a 4xx page, no traceback
    response = await page.goto(base_url + "/jobs?state=exploded")
    assert response.status == 400
    await expect(page.locator("p.error")).to_contain_text("state must be one of")
    response = await page.goto(base_url + "/jobs/424242424")
    assert response.status == 404


async def test_actions_change_the_rows(page, base_url, dsn, ids):
    # retry the failed job
    await page.goto(f"{base_url}/jobs/{ids['boom']}")
    await page.click("#actions button:has-text('Retry')")
    await expect(page.locator(".flash")).to_contain_text("retried")
    assert db(
        dsn, "SELECT state::text, attempt FROM awa_fast.jobs_all WHERE id = %s", (ids["boom"],)
    ) == ("available", 0)

    # cancel the scheduled job (accepting the confirm dialog)
    await page.goto(f"{base_url}/jobs/{ids['later']}")
    await page.click("#actions button:has-text('Cancel')")
    await expect(page.locator(".flash")).to_contain_text("cancelled")
    assert db(dsn, "SELECT state::text FROM awa_fast.jobs_all WHERE id = %s", (ids["later"],)) == (
        "cancelled",
    )
    await expect(page.locator("#actions button:has-text('Cancel')")).to_have_count(0)

    # pause and resume a queue
    await page.goto(base_url + "/queues")
    await page.click('tr[data-queue="shipping"] button:has-text("Pause")')
    await expect(page.locator('tr[data-queue="shipping"]')).to_contain_text("paused")
    assert db(dsn, "SELECT paused FROM awa_fast.queue_meta WHERE queue = 'shipping'") == (True,)
    await page.click('tr[data-queue="shipping"] button:has-text("Resume")')
    await expect(page.locator('tr[data-queue="shipping"]')).to_contain_text("active")
    assert db(dsn, "SELECT paused FROM awa_fast.queue_meta WHERE queue = 'shipping'") == (False,)

    # retry from the DLQ: back in the job table under the same id
    await page.goto(base_url + "/dlq")
    await page.click(f'tr[data-id="{ids["dead"]}"] button:has-text("Retry")')
    await expect(page).to_have_url(f"{base_url}/jobs/{ids['dead']}")
    await expect(page.locator(".flash")).to_contain_text("moved from the DLQ")
    assert db(dsn, "SELECT count(*) FROM awa_fast.dlq WHERE id = %s", (ids["dead"],)) == (0,)
    assert db(
        dsn, "SELECT state::text, attempt FROM awa_fast.jobs_all WHERE id = %s", (ids["dead"],)
    ) == ("available", 0)


async def test_token_login(page, dsn, ids):
    with served(dsn, "--token", "correct horse") as url:
        response = await page.goto(url + "/queues")
        assert response.status == 401
        await page.fill("input[name=token]", "wrong")
        await page.click("form.card button")
        await expect(page.locator("p.error[role=alert]")).to_contain_text("Wrong token")
        await page.fill("input[name=token]", "correct horse")
        await page.click("form.card button")
        await expect(page).to_have_url(url + "/queues")
        await expect(page.locator('tr[data-queue="default"]')).to_be_visible()
