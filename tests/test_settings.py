"""Settings: typed and ranged; file < environment < overrides; every error names its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from climate.config import Settings, load_settings
from climate.errors import InvalidInput


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CLIMATE_PORT": "abc"}, "CLIMATE_PORT: must be an integer, not 'abc'"),
        ({"CLIMATE_PORT": "0"}, "CLIMATE_PORT: must be at least 1, not '0'"),
        ({"CLIMATE_PORT": "65536"}, "CLIMATE_PORT: must be at most 65535, not '65536'"),
        ({"CLIMATE_MAX_BODY_BYTES": "-1"}, "CLIMATE_MAX_BODY_BYTES: must be at least 1, not '-1'"),
        (
            {"CLIMATE_EVENT_CLAIM_SECONDS": "-5"},
            "CLIMATE_EVENT_CLAIM_SECONDS: must be above 0, not '-5'",
        ),
        (
            {"CLIMATE_WEBHOOK_TIMEOUT_SECONDS": "0"},
            "CLIMATE_WEBHOOK_TIMEOUT_SECONDS: must be above 0, not '0'",
        ),
        (
            {"CLIMATE_BACKEND_TIMEOUT_SECONDS": "nan"},
            "CLIMATE_BACKEND_TIMEOUT_SECONDS: must be a finite number, not 'nan'",
        ),
        (
            {"CLIMATE_AUTH": "basic"},
            "CLIMATE_AUTH: must be one of 'noauth', 'token' or 'keystone', not 'basic'",
        ),
        (
            {"CLIMATE_ALLOW_NOAUTH_PUBLIC": "perhaps"},
            "CLIMATE_ALLOW_NOAUTH_PUBLIC: must be true or false, not 'perhaps'",
        ),
        ({"CLIMATE_FAULT_RATE": "1.5"}, "CLIMATE_FAULT_RATE: must be at most 1, not '1.5'"),
        (
            {"CLIMATE_HEADER_TIMEOUT_SECONDS": "0"},
            "CLIMATE_HEADER_TIMEOUT_SECONDS: must be above 0, not '0'",
        ),
        ({"CLIMATE_MAX_CONNECTIONS": "0"}, "CLIMATE_MAX_CONNECTIONS: must be at least 1, not '0'"),
    ],
)
def test_a_bad_variable_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        load_settings(env=env)
    assert refused.value.message == message


def test_a_bad_file_value_names_the_setting_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "climate.toml"
    config.write_text("[climate]\nport = 'abc'\n")
    with pytest.raises(InvalidInput) as refused:
        load_settings(str(config), env={})
    assert refused.value.message == f"port in {config}: must be an integer, not 'abc'"
    config.write_text("[climate]\nprot = 1234\n")
    with pytest.raises(InvalidInput, match=f"^prot in {config}: unknown setting$"):
        load_settings(str(config), env={})
    with pytest.raises(InvalidInput, match="^webhook_max_attempts: must be at least 1, not 0$"):
        load_settings(env={}, webhook_max_attempts=0)
    with pytest.raises(InvalidInput, match="^config: cannot read /nonexistent.toml"):
        load_settings("/nonexistent.toml", env={})


def test_overrides_beat_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    config = tmp_path / "climate.toml"
    config.write_text("[climate]\nport = 2000\nwebhooks = ['http://a/1', 'http://b/2']\n")
    assert load_settings(str(config), env={}).port == 2000
    assert load_settings(env={"CLIMATE_CONFIG": str(config)}).webhooks == (
        "http://a/1",
        "http://b/2",
    )
    assert load_settings(str(config), env={"CLIMATE_PORT": "3000"}).port == 3000
    assert load_settings(str(config), env={"CLIMATE_PORT": "3000"}, port=4000).port == 4000
    from_env = load_settings(env={"CLIMATE_WEBHOOKS": "http://a/1, http://b/2,"})
    assert from_env.webhooks == ("http://a/1", "http://b/2")
    assert load_settings(env={"CLIMATE_ALLOW_NOAUTH_PUBLIC": "yes"}).allow_noauth_public


def test_settings_are_frozen_and_read_nothing_implicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIMATE_PORT", "4321")
    assert load_settings(env={}).port == 1234
    assert Settings().port == 1234
    assert load_settings().port == 4321
    settings = load_settings(env={})
    with pytest.raises(ValueError, match="frozen"):
        settings.port = 1  # type: ignore[misc]
    assert settings.model_copy(update={"auth": "token"}).auth == "token"


def test_every_default_loads() -> None:
    settings = load_settings(env={})
    assert (settings.port, settings.max_body_bytes, settings.event_claim_seconds) == (
        1234,
        1_048_576,
        120.0,
    )
    assert (
        settings.header_timeout_seconds,
        settings.body_timeout_seconds,
        settings.max_connections,
    ) == (10.0, 30.0, 1000)
