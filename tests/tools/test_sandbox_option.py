"""The sandbox's isolation is set from any dialect (``openrft.sandbox_isolation``), and the message of a host
without bubblewrap names that option, which the calculator example's own Nova recipe accepts."""

from __future__ import annotations

from openrft.rewards.sandbox import mechanism
from openrft.spec.dialects import load_job
from tests.tools.test_train_tools import tools_recipe


def test_a_nova_recipe_sets_the_sandbox_isolation(tmp_path):
    assert load_job(tools_recipe(tmp_path)).reward.sandbox.isolation == "strict"
    weak = load_job(tools_recipe(tmp_path, sandbox_isolation="weak"))
    assert weak.reward.sandbox.isolation == "weak"


def test_the_missing_bubblewrap_message_names_the_dialects_option(tmp_path, monkeypatch):
    monkeypatch.setattr(mechanism, "bwrap_path", lambda: None)
    mechanism.strict_unavailable.cache_clear()
    try:
        message = mechanism.strict_unavailable()
    finally:
        mechanism.strict_unavailable.cache_clear()
    assert "apt-get install bubblewrap" in message and "openrft.sandbox_isolation: weak" in message
    # the option the message names is one the calculator's recipe (a Nova recipe) accepts
    key, value = "sandbox_isolation", message.split("openrft.sandbox_isolation: ")[1].split()[0]
    assert load_job(tools_recipe(tmp_path, **{key: value})).reward.sandbox.isolation == "weak"
