"""``outbox dispatch``'s options are made from DispatcherConfig: a setting's default
is written once, in the dataclass. Pure: builds parsers, runs nothing."""

from __future__ import annotations

import dataclasses

import pytest

from dispatchers.cli import build_parser
from dispatchers.cli.dispatch import config_from_args
from dispatchers.runtime.config import DispatcherConfig


def _field(name: str) -> dataclasses.Field[object]:
    return next(f for f in dataclasses.fields(DispatcherConfig) if f.name == name)


def _help_of(flag: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The help ``outbox dispatch --help`` prints for ``flag``, on one line."""
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dispatch", "--help"])
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 3)),
        len(lines),
    )
    return " ".join(" ".join(lines[start:end]).split())


def test_the_options_defaults_make_the_default_config() -> None:
    args = build_parser().parse_args(["dispatch"])
    assert config_from_args(args) == DispatcherConfig()


@pytest.mark.parametrize(
    ("name", "flag", "value", "shown"),
    [
        ("concurrency", "--concurrency", 7, "7"),
        ("lease", "--lease", 45.5, "45.5"),
        ("claim_window", "--claim-window", 0.25, "0.25"),
        ("retention", "--retention", 3 * 86400.0, "3d"),
        ("http_client", "--http-client", "httpx", "httpx"),
        ("metrics_host", "--metrics-host", "0.0.0.0", "0.0.0.0"),
    ],
)
def test_changing_a_default_in_the_config_changes_the_option_and_its_help(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    flag: str,
    value: object,
    shown: str,
) -> None:
    field = _field(name)
    assert field.default != value
    monkeypatch.setattr(field, "default", value)
    assert getattr(build_parser().parse_args(["dispatch"]), name) == value
    assert _help_of(flag, capsys).endswith(f"(default: {shown})")


def test_a_true_boolean_setting_is_turned_off_by_its_no_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    assert parser.parse_args(["dispatch"]).listen is True
    assert parser.parse_args(["dispatch", "--no-listen"]).listen is False
    monkeypatch.setattr(_field("listen"), "default", False)
    assert build_parser().parse_args(["dispatch", "--listen"]).listen is True
