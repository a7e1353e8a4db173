"""``outbox.receiver.verify`` against the reference ``standardwebhooks`` library.

The same generated requests go to both: valid signatures, tampered bodies,
malformed ``webhook-signature`` lists, odd timestamps, str and non-UTF-8 bodies.
Wherever the reference gives a verdict (it returns, or raises its
``WebhookVerificationError``), verify must give the same one, with one exception
by design: verify reads the timestamp and each signature exactly as they were
signed, where the reference reads them leniently (a timestamp as a float, base64
skipping stray characters). The property checks that every disagreement is of
that kind; the named tests after it pin each deliberate difference down. Where
the reference raises anything else (a malformed entry before the match, a body
that is not UTF-8), it gives no verdict, and verify must still give one.

Both read one frozen clock: verify through ``now``, the reference through its
``datetime.now``, the only thing patched. Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from unittest import mock

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from standardwebhooks import webhooks
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from outbox.receiver import InvalidSignature, verify
from outbox.secrets import MAX_KEY_BYTES, MIN_KEY_BYTES

T0 = 1_700_000_000
TOLERANCE = 300
"""The reference's fixed five minutes, and verify's default."""
KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"type":"invoice.paid"}'
ARABIC_INDIC = str.maketrans(
    "0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
)


@contextmanager
def reference_clock(now: float) -> Iterator[None]:
    """The reference library's ``datetime.now`` reads ``now``; nothing else changes."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return datetime.fromtimestamp(now, tz=tz)

    with mock.patch.object(webhooks, "datetime", Frozen):
        yield


def reference_verdict(
    secret: str, headers: dict[str, str], body: bytes | str, now: float
) -> str | None:
    """ "accept" or "reject" as the reference decides, or None where it raises
    something other than its verification error (it gives no verdict)."""
    with reference_clock(now):
        try:
            Webhook(secret).verify(body, headers, json_parse=False)
        except WebhookVerificationError:
            return "reject"
        except ValueError:  # a malformed entry, bad padding, a body that is not UTF-8
            return None
    return "accept"


def our_verdict(secret: str, headers: dict[str, str], body: bytes, now: float) -> str:
    """ "accept" or "reject"; any other exception fails the test."""
    try:
        verify(secret, headers, body, now=now)
    except InvalidSignature:
        return "reject"
    return "accept"


def mac(key: bytes, msg_id: str, stamp: str, body: bytes) -> bytes:
    content = f"{msg_id}.{stamp}.".encode() + body
    return hmac.new(key, content, hashlib.sha256).digest()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def reference_reading(stamp: str) -> str | None:
    """The timestamp the reference signs for a ``webhook-timestamp`` of ``stamp``
    (the whole seconds of it read as a float), or None if it cannot read it."""
    try:
        at = datetime.fromtimestamp(float(stamp), tz=UTC)
        return str(math.floor(at.timestamp()))
    except (ValueError, OverflowError, OSError):
        return None


def as_the_reference_reads(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` rewritten in the canonical form of what the reference reads in
    them: the timestamp as whole seconds, each signature entry re-encoded from
    what its lenient base64 decoding gives (entries it cannot read left out)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    entries = []
    for entry in lowered["webhook-signature"].split(" "):
        parts = entry.split(",")
        if len(parts) != 2:
            continue
        try:
            raw = base64.b64decode(parts[1])
        except ValueError:  # binascii.Error, or characters that are not ASCII
            continue
        entries.append(f"{parts[0]},{b64(raw)}")
    stamp = reference_reading(lowered["webhook-timestamp"])
    assert stamp is not None  # the reference accepted it
    return {
        "webhook-id": lowered["webhook-id"],
        "webhook-timestamp": stamp,
        "webhook-signature": " ".join(entries),
    }


@dataclass(frozen=True)
class Case:
    """One request, as a receiver holding ``secret`` sees it at ``now``."""

    secret: str
    headers: dict[str, str]
    body: bytes | str
    """A str is what a framework hands over after decoding the raw body as UTF-8."""
    now: float

    @property
    def raw_body(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


def timestamp_forms(digits: str) -> list[str]:
    """Ways to write ``digits`` seconds that only a lenient reader takes as them."""
    return [
        "0" + digits,
        "00" + digits,
        "+" + digits,
        "-" + digits,
        digits + ".0",
        digits + ".5",
        digits + ".999999",
        " " + digits,
        digits + " ",
        digits + "\t",
        digits[:2] + "_" + digits[2:],
        digits + "e0",
        digits.translate(ARABIC_INDIC),
    ]


MSG_IDS = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    min_size=1,
    max_size=24,
).map(lambda s: "msg_" + s)


def chance(draw: st.DrawFn, tenths: int) -> bool:
    """True ``tenths`` times in ten (and what hypothesis shrinks towards)."""
    return draw(st.integers(0, 9)) < tenths


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    """Mostly whole seconds near the tolerance's edges; else anywhere; written
    canonically or in a form only a lenient reader takes, or not a number."""
    if chance(draw, 8):
        edges = [-TOLERANCE - 1, -TOLERANCE, TOLERANCE, TOLERANCE + 1]
        offset = draw(st.integers(-TOLERANCE - 3, TOLERANCE + 3) | st.sampled_from(edges))
    else:
        offset = draw(st.integers(-T0, 10**13))
    digits = str(T0 + offset)
    if chance(draw, 5):
        return digits
    if chance(draw, 7):
        return draw(st.sampled_from(timestamp_forms(digits)))
    return draw(
        st.sampled_from(["9" * 30, "1e400", "nan", "inf", "-inf", "0", "abc"])
        | st.text(max_size=12)
    )


def stray(encoded: str) -> st.SearchStrategy[str]:
    """``encoded`` with something inserted that a non-validating base64 decoder
    skips (whitespace, characters outside the alphabet) or ignores (data after
    the padding)."""
    return st.tuples(
        st.integers(0, len(encoded)),
        st.sampled_from(["\t", "\n", "\x0b", "!", "-", "_", ".", "=", "AAAA", "é"]),
    ).map(lambda at: encoded[: at[0]] + at[1] + encoded[at[0] :])


def entries(good: bytes, wrong: bytes) -> st.SearchStrategy[str]:
    """One entry of a ``webhook-signature`` list: another secret's signature, the
    right one under another version or malformed, or anything."""
    valid = b64(good)
    return st.one_of(
        st.just(f"v1,{b64(wrong)}"),
        st.sampled_from(["v2", "v1a", "V1", "v0", "", "v1 "]).map(lambda v: f"{v},{valid}"),
        st.just(f"v1,{valid.rstrip('=')}"),
        stray(valid).map(lambda s: f"v1,{s}"),
        st.sampled_from([f"v1,{valid},x", f"v1{valid}", valid, f"v1,{valid[:-4]}", "garbage"]),
        st.text(max_size=16),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    key = draw(st.binary(min_size=MIN_KEY_BYTES, max_size=MAX_KEY_BYTES))
    other = bytes(b ^ 0xFF for b in key)  # another secret of the same length
    msg_id = draw(MSG_IDS if chance(draw, 8) else st.text(max_size=12))
    stamp = draw(timestamps())
    body: bytes | str = draw(st.binary(max_size=48) | st.text(max_size=48))
    raw = body.encode() if isinstance(body, str) else body
    # the sender signed the stamp as sent, or as the reference reads it
    reading = reference_reading(stamp)
    signed_stamp = draw(st.sampled_from([stamp] if reading is None else [stamp, reading]))
    signed_body = raw if chance(draw, 8) else draw(st.sampled_from([raw + b"!", raw[:-1]]))
    good = mac(key, msg_id, signed_stamp, signed_body)
    listed = draw(
        st.lists(entries(good, mac(other, msg_id, signed_stamp, signed_body)), max_size=3)
    )
    if not listed or chance(draw, 6):
        listed.insert(draw(st.integers(0, len(listed))), f"v1,{b64(good)}")
    separator = " " if chance(draw, 7) else draw(st.sampled_from(["  ", "\t", ", ", "\n", "\xa0"]))
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": separator.join(listed),
    }
    if chance(draw, 1):
        headers[draw(st.sampled_from(sorted(headers)))] = ""
    spell = draw(st.sampled_from([str.lower, str.title, str.upper]))
    return Case(
        secret="whsec_" + b64(key if chance(draw, 8) else other),
        headers={spell(name): value for name, value in headers.items() if value or chance(draw, 5)},
        body=body,
        now=T0 + draw(st.sampled_from([0, 0.25, 0.999999])),
    )


def assert_agrees_or_differs_by_design(case: Case) -> str:
    """verify's verdict on ``case``, checked against the reference's.

    Where the reference gives a verdict, verify gives the same one, but for the
    one difference by design: the reference accepts a timestamp or a signature
    written in a form other than the one signed, which verify refuses. Where the
    reference gives none (it raises another error), nothing is said of it. What
    the reference does with a given input changes between its releases (1.3
    compares each entry as a string, where 1.1 decodes it leniently); this holds
    for every release the ``dev`` extra allows.
    """
    ours = our_verdict(case.secret, case.headers, case.raw_body, case.now)
    theirs = reference_verdict(case.secret, case.headers, case.body, case.now)
    if theirs is None or theirs == ours:
        return ours
    assert (theirs, ours) == ("accept", "reject")
    canonical = as_the_reference_reads(case.headers)
    assert canonical != {name.lower(): value for name, value in case.headers.items()}
    # Written as signed, the same request gets the reference's verdict from verify.
    # That is "accept", except at the edge of the window: a timestamp with a fraction
    # can be inside it while its whole seconds, which are what is signed, are not.
    assert our_verdict(case.secret, canonical, case.raw_body, case.now) == reference_verdict(
        case.secret, canonical, case.body, case.now
    )
    return ours


@settings(max_examples=1000)
@given(case=cases())
@example(  # a fractional timestamp whose whole seconds are just outside the window
    case=Case(
        secret="whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        headers={
            "webhook-id": "msg_0",
            "webhook-timestamp": "1699999700.5",
            "webhook-signature": "v1,GphNnKbuIx5EhZqYHoBrjAmAtQ+SF8ZYMF02pT7C0EU=",
        },
        body=b"",
        now=1700000000.25,
    )
)
@pytest.mark.slow
def test_verify_gives_the_reference_verdict_wherever_the_reference_gives_one(case: Case) -> None:
    ours = assert_agrees_or_differs_by_design(case)
    event(f"reference: {reference_verdict(case.secret, case.headers, case.body, case.now)}")
    event(f"verify: {ours}")


# --- verify's verdict where it is stricter than a reader could be, each pinned down ---


def signed(stamp: str, *, signed_stamp: str | None = None, body: bytes = BODY) -> dict[str, str]:
    """Headers for ``body`` under :data:`KEY`, its signature over ``signed_stamp``
    (default: the ``stamp`` sent)."""
    good = mac(KEY, "msg_1", signed_stamp or stamp, body)
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": stamp,
        "webhook-signature": f"v1,{b64(good)}",
    }


NOW = str(T0)


def verdict(headers: dict[str, str], body: bytes = BODY) -> str:
    """verify's verdict at :data:`T0` under :data:`SECRET`, checked against the reference's."""
    return assert_agrees_or_differs_by_design(Case(SECRET, headers, body, T0))


def test_verify_accepts_a_valid_request_and_rejects_a_tampered_one() -> None:
    assert verdict(signed(NOW)) == "accept"
    assert verdict(signed(NOW), BODY + b" ") == "reject"
    assert reference_verdict(SECRET, signed(NOW), BODY, T0) == "accept"
    assert reference_verdict(SECRET, signed(NOW), BODY + b" ", T0) == "reject"


@pytest.mark.parametrize(
    "stamp",
    [form for form in timestamp_forms(NOW) if not form.startswith("-")],  # negative: stale
)
def test_verify_refuses_a_timestamp_not_written_as_signed(stamp: str) -> None:
    """A reader may take these as the number that was signed (the reference reads a
    float's whole seconds); verify takes only the form that was signed."""
    headers = signed(stamp, signed_stamp=NOW)
    with pytest.raises(InvalidSignature, match="webhook-timestamp is not an integer"):
        verify(SECRET, headers, BODY, now=T0)
    verdict(headers)


def test_verify_rejects_a_timestamp_with_a_leading_zero_signed_as_sent() -> None:
    assert verdict(signed("0" + NOW)) == "reject"


@pytest.mark.parametrize(
    "lenient",
    [
        "{good}\t",
        "{good}\n",
        "{head}!{tail}",
        "{head}\x0b{tail}",
        "{good}AAAA",
        "{head}={tail}",
        "{good}=",
    ],
)
def test_verify_refuses_a_signature_that_decodes_only_leniently(lenient: str) -> None:
    """A non-validating base64 decoder skips these characters or the data after
    the padding; verify takes standard base64 only."""
    headers = signed(NOW)
    good = headers["webhook-signature"].removeprefix("v1,")
    headers["webhook-signature"] = "v1," + lenient.format(good=good, head=good[:10], tail=good[10:])
    assert verdict(headers) == "reject"


def test_verify_rejects_a_header_spelt_twice_with_different_values() -> None:
    """A reader that folds the names takes one of the two; verify takes neither."""
    headers = {"Webhook-Id": "msg_forged", **signed(NOW)}
    with pytest.raises(InvalidSignature, match="conflicting webhook-id"):
        verify(SECRET, headers, BODY, now=T0)


def test_verify_refuses_a_str_body() -> None:
    with pytest.raises(TypeError, match="raw request bytes"):
        verify(SECRET, signed(NOW), BODY.decode(), now=T0)  # type: ignore[arg-type]


def test_verify_checks_a_body_that_is_not_utf8_as_bytes() -> None:
    body = b"\xff\xfe binary \x80"
    headers = signed(NOW, body=body)
    assert verdict(headers, body) == "accept"
    assert verdict(headers, body + b"\x00") == "reject"


@pytest.mark.parametrize(
    "malformed",
    ["garbage", "v1,a,b", "v1,{unpadded}", "", "v1,\u00e9"],
)
def test_verify_skips_a_malformed_entry_before_or_after_the_match(malformed: str) -> None:
    headers = signed(NOW)
    good = headers["webhook-signature"]
    entry = malformed.format(unpadded=good[3:].rstrip("="))
    headers["webhook-signature"] = f"{entry} {good}"
    assert verdict(headers) == "accept"
    headers["webhook-signature"] = f"{good} {entry}"
    assert verdict(headers) == "accept"


@pytest.mark.parametrize("separator", ["\t", "\n", "\x0c", "\xa0"])
def test_verify_splits_the_signature_list_on_spaces_only(separator: str) -> None:
    headers = signed(NOW)
    headers["webhook-signature"] = f"garbage{separator}{headers['webhook-signature']}"
    assert verdict(headers) == "reject"


@pytest.mark.slow
def test_verify_rejects_an_id_no_sender_could_have_signed() -> None:
    headers = {**signed(NOW), "webhook-id": "msg_\ud800"}
    with pytest.raises(InvalidSignature, match="webhook-id"):
        verify(SECRET, headers, BODY, now=T0)
