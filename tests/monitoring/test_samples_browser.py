"""The samples view and the runs comparison in headless Chromium, against a real ``openrft serve`` with API keys
that ran two real demo jobs: a step's samples, filtered and sorted; one sample's trajectory with its graders;
one validation prompt's answers across evaluations; two runs' curves overlaid with their settings side by
side; ``openrft jobs samples`` against the same server. Saves the screenshots docs/monitoring.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.monitoring.test_dashboard_browser import browser  # noqa: F401 (the fixture)
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status

pytestmark = pytest.mark.slow
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


STEPS, VALIDATION_PROMPTS = 5, 6


def _recipe(train: str, validation: str, name: str, lr: float) -> dict:
    """5 steps of 4 prompts x 4 samples, validation on 6 prompts at every step; 2 prompts' samples recorded."""
    recipe = tiny_recipe(train, validation, steps=STEPS, name=name)
    recipe["training_config"]["trainer"]["optim_config"]["lr"] = lr
    recipe["openrft"]["eval_max_examples"] = VALIDATION_PROMPTS
    return recipe


def _rewards(page) -> list[float]:
    return [float(t) for t in page.locator("#samples tbody td.reward").all_inner_texts() if t != "—"]


def test_samples_and_compared_runs_in_the_browser(tmp_path, browser):  # noqa: F811
    service = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    key = service.create_key("samples")
    try:
        service.serve(workers=2)  # the two jobs run at once, one thread each
        client = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        train = upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
        validation = upload(client, small_dataset(tmp_path / "validation.jsonl", VALIDATION, VALIDATION_PROMPTS))
        ids = []
        for name, lr in (("lr-3e-4", 3e-4), ("lr-1e-3", 1e-3)):
            response = client.post("/v1/nova/jobs", json=_recipe(train, validation, name, lr))
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])
        for job_id in ids:
            assert wait_status(client, job_id, ("succeeded", "failed"), timeout=300)["status"] == "succeeded"

        # the same samples from the command line, one JSON object per line
        cli = service.cli("jobs", "samples", ids[0], "--json", "--kind", "eval", api_key=key)
        assert cli.returncode == 0, cli.stderr
        lines = [json.loads(line) for line in cli.stdout.splitlines()]
        assert [r["step"] for r in lines] == [s for s in range(STEPS + 1) for _ in range(VALIDATION_PROMPTS)]
        assert all(isinstance(r["prompt"], list) and isinstance(r["response"], str) for r in lines)

        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(service.base_url + "/")
        page.locator("#key-view").wait_for(state="visible", timeout=15_000)
        page.fill("#key-input", key)
        page.click("#key-form button")

        # two runs compared: both train-reward curves on one chart, the learning rate side by side
        for job_id in ids:
            page.locator(f"tr[data-job-id='{job_id}'] input.pick").check()
        page.click("#compare-selected")
        page.wait_for_url("**/?compare=*")
        chart = page.locator("#compare-charts .chart[data-metric='critic/rewards/mean']")
        chart.wait_for(state="visible", timeout=15_000)
        assert chart.get_attribute("data-points") == str(2 * STEPS)  # every step of each run
        assert page.locator("#compare-jobs tbody tr").count() == 2
        lr = page.locator("#settings tr[data-setting='optimizer.lr']")
        assert lr.inner_text().split("\t")[1:] == ["0.0003", "0.001"]
        assert page.locator("#settings tr[data-setting='sampling.temperature']").count() == 0  # equal: hidden
        page.uncheck("#only-differences")
        page.locator("#settings tr[data-setting='sampling.temperature']").wait_for(timeout=15_000)
        page.check("#only-differences")
        page.locator("#compare-view").screenshot(path=str(IMAGES / "dashboard-compare.png"))

        # one job's samples: the latest evaluation's answers by default
        page.goto(f"{service.base_url}/?job={ids[0]}")
        rows = page.locator("#samples tbody tr")
        rows.first.wait_for(timeout=15_000)
        assert rows.count() == VALIDATION_PROMPTS and f"latest ({STEPS})" in page.locator("#s-step").inner_text()
        page.select_option("#s-kind", "train")
        page.wait_for_function("document.querySelectorAll('#samples tbody tr').length === 8")  # 2 prompts x 4
        page.click("#samples th[data-order='reward']")
        page.locator("#samples th.sorted[data-direction='descending']").wait_for(timeout=15_000)
        assert _rewards(page) == sorted(_rewards(page), reverse=True)
        page.select_option("#s-step", "all")
        page.fill("#s-min", "1")
        page.locator("#s-min").dispatch_event("change")
        page.wait_for_function(
            "[...document.querySelectorAll('#samples tbody td.reward')].every(td => td.textContent === '1.000')"
        )
        page.fill("#s-min", "")
        page.locator("#s-min").dispatch_event("change")
        page.select_option("#s-error", "any")
        page.locator("#no-samples").wait_for(state="visible", timeout=15_000)  # exact_match never fails
        page.select_option("#s-error", "")
        page.select_option("#s-kind", "eval")
        page.select_option("#s-step", str(STEPS))
        page.wait_for_function(f"document.querySelectorAll('#samples tbody tr').length === {VALIDATION_PROMPTS}")
        page.locator("#samples-section").screenshot(path=str(IMAGES / "dashboard-samples.png"))

        # one sample's whole trajectory, and its prompt's answers at every evaluation
        rows.first.click()
        detail = page.locator("#sample-detail")
        detail.wait_for(state="visible", timeout=15_000)
        assert page.locator("#detail-body .message.user").count() == 1
        assert page.locator("#detail-body .message.assistant").count() == 1
        assert "exact_match" in page.locator("#detail-body table.graders").inner_text()
        across = page.locator("#across tbody tr")
        page.wait_for_function(f"document.querySelectorAll('#across tbody tr').length === {STEPS + 1}")
        steps = [across.nth(i).locator("td").first.inner_text() for i in range(STEPS + 1)]
        assert steps == [str(s) for s in range(STEPS + 1)]
        assert page.locator("#across tr.current").count() == 1
        detail.screenshot(path=str(IMAGES / "dashboard-sample.png"))
        assert not errors, errors
        client.close()
    finally:
        service.stop_all()
