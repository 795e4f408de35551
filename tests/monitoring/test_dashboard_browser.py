"""The dashboard in headless Chromium (Debian's, driven by Playwright) against a real ``openrft serve`` with
API keys, running a real demo job: the key form, the job in the list, a chart whose points grow while the
job runs, and cancel from the page. Saves the screenshot docs/monitoring.md shows (docs/images/dashboard.png).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"
TRAIN_CHART = ".chart[data-metric='critic/rewards/mean']"


def _points(page) -> int:
    return int(page.locator(TRAIN_CHART).get_attribute("data-points") or 0)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def _learning_recipe(train: str, validation: str) -> dict:
    """A demo job long enough to be cancelled from the page, whose curves are worth a screenshot: 8 prompts x 8
    samples a step at a learning rate the demo model learns with (about 2 s a step here), KL logged,
    validation on 32 examples every 2 steps."""
    recipe = tiny_recipe(train, validation, steps=200, name="dashboard-demo", save_steps=4)
    config = recipe["training_config"]
    config["global_batch_size"] = 64
    config["rollout"]["advantage_strategy"]["number_generation"] = 8
    config["trainer"].update({"test_steps": 1, "refit_freq": 2, "kl_loss_coef": 0.001, "optim_config": {"lr": 2e-5}})
    recipe["openrft"].update({"eval_max_examples": 32, "max_train_examples": 256})
    return recipe


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (.ci/run installs Debian's chromium)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def test_dashboard_follows_a_running_job_and_cancels_it(tmp_path, browser):
    service = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    key = service.create_key("dashboard")
    try:
        service.serve(workers=1)
        client = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        train = upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 256))
        validation = upload(client, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 32))
        response = client.post("/v1/nova/jobs", json=_learning_recipe(train, validation))
        assert response.status_code == 200, response.text
        job_id = response.json()["id"]

        page = browser.new_page(viewport={"width": 1360, "height": 1180})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(service.base_url + "/")
        # keys are configured: the page asks for one, then lists the tenant's jobs
        page.locator("#key-view").wait_for(state="visible", timeout=15_000)
        page.fill("#key-input", key)
        page.click("#key-form button")
        row = page.locator(f"tr[data-job-id='{job_id}']")
        row.wait_for(state="visible", timeout=15_000)
        assert "nova" in row.inner_text() and "openrft-demo" in row.inner_text()

        row.locator("a").click()
        page.wait_for_url(f"**/?job={job_id}")
        page.locator(TRAIN_CHART).wait_for(state="visible", timeout=15_000)
        page.locator(f"{TRAIN_CHART} canvas").wait_for(state="attached", timeout=15_000)
        _wait_for(lambda: _points(page) >= 1, 180, "the first train reward point")
        first = _points(page)
        _wait_for(lambda: _points(page) >= first + 2, 120, "the chart to grow while the job runs")
        _wait_for(lambda: _points(page) >= 10, 120, "ten steps for the screenshot")
        assert page.locator("#job-status").inner_text().startswith("running")
        assert page.locator("#checkpoints tbody tr").count() >= 1  # saved every 4 steps
        assert "Step" in page.locator("#events").inner_text()
        # what the job asks for (the API's resources): no cluster, so one learner in the job's process
        info = page.locator("#job-info").inner_text()
        assert "Resources" in info and "1 learner in the job's process on the worker" in info
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        page.on("dialog", lambda dialog: dialog.accept())
        page.click("#cancel")
        done = wait_status(client, job_id, ("cancelled", "succeeded", "failed"), timeout=60)
        assert done["status"] == "cancelled", done
        page.locator("#job-status.cancelled").wait_for(timeout=15_000)
        assert page.locator("#cancel").is_disabled() and page.locator("#pause").is_disabled()
        assert done["step"] < 200 and not errors, errors
        client.close()
    finally:
        service.stop_all()
