"""Hostile command-line values for property tests: what a careless or malicious
operator could type where a number, a duration, a time, an id or a URL is due."""

from __future__ import annotations

from hypothesis import strategies as st

NUMBERS = st.sampled_from(
    [
        "inf",
        "-inf",
        "nan",
        "-0",
        "0",
        "-1",
        "1e308",
        "1e309",
        "-1e308",
        "1e-320",
        "9223372036854775807",
        "9223372036854775808",
        "99999999999999999999999",
        "9" * 5000,
        "0x10",
        "1_000",
        "٣",
        "",
        " ",
        "999999999w",
        "5215w",
        "1w",
        "0s",
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00+14:00",
        "2024-05-01T12:00:00",
        "2024-05-01T12:00:00Z",
    ]
)
"""Values that broke, or could break, a parser or what is derived from it."""

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40) | st.builds(
    lambda c, n: c * n, st.sampled_from("9a-.:/%"), st.integers(100, 5000)
)
"""Anything a shell can pass (no control characters), overlong strings included."""

HOSTILE = NUMBERS | TEXT | st.integers().map(str) | st.floats().map(repr)

URLS = st.sampled_from(
    [
        "http://127.1/",
        "http://2130706433/",
        "http://017700000001/",
        "http://0x7f.1/",
        "http://127.0.0.1./",
        "http://[::1/",
        "http://[::ffff:127.0.0.1]/",
        "http://%31%32%37.0.0.1/",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://u:pw@example.com/",
        "http://example.com/#x",
        "postgresql://u:pw@[::1/db",
        "http://" + "a" * 3000 + "/",
        "https://example.com/ok",
    ]
) | HOSTILE.map(lambda host: f"http://{host}/")
