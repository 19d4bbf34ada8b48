"""Replacing injected values by their placeholders in replies: every form, across chunk boundaries, inside
compressed bodies; and refusing what cannot be decoded with certainty."""

import base64
import gzip
import json
import random
import re
import zlib
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import brotli
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egressd import scrub as scrub_module
from egressd.scrub import (
    STEP,
    BodyScrubber,
    Scrubber,
    ScrubError,
    Secret,
    StreamScrubber,
    body_scrubber,
)

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]

VALUE = b"sk-live_4f9Qz7/Lm+Xc2Vb8Np3Rt6Yw1Kd5Hg0J"  # '/' and '+' for percent, JSON and base64 specials
PH = b"egressd_ph_Q7mZp2Lx9Kc4Vb8Nw3Rt6Yh1Jd5Gf0Sa"
OTHER = b"ghp_0123456789abcdefABCDEFghijklmnopqrstu"  # 41 bytes: in base64 what follows it shifts
OTHER_PH = b"egressd_ph_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
SECRET = Secret("api", VALUE, PH)
SCRUBBER = Scrubber([SECRET, Secret("gh", OTHER, OTHER_PH)])


def lenient_b64decode(text: bytes) -> bytes:
    """Decode what a forgiving decoder would: either alphabet, '=' anywhere ignored, a dangling char dropped."""
    text = re.sub(rb"[^A-Za-z0-9+/_-]", b"", text).replace(b"-", b"+").replace(b"_", b"/")
    if len(text) % 4 == 1:
        text = text[:-1]
    return base64.b64decode(text + b"=" * (-len(text) % 4))


def b64_decodings(data: bytes) -> list[bytes]:
    """Every base64-looking run of data decoded from each of its first four characters: whatever alignment a
    value was at, one of these would show it."""
    return [
        lenient_b64decode(run[skip:])
        for run in re.findall(rb"[A-Za-z0-9+/_=-]{8,}", data)
        for skip in range(4)
    ]


def text_forms(value: bytes) -> list[bytes]:
    quoted = quote(value, safe="").encode()
    return [
        value,
        quoted,
        re.sub(rb"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted),  # lower-case hex
        quote_plus(value).encode(),
        quote(value, safe="/").encode(),
        json.dumps(value.decode()).encode()[1:-1],
        json.dumps(value.decode()).replace("/", "\\/").encode()[1:-1],
    ]


def base64_forms(value: bytes) -> list[bytes]:
    """value inside longer base64 texts, at the three byte alignments, both alphabets, padded and not."""
    out = []
    for prefix in (b"user:", b"user", b"use", b"", b"u", b"us"):
        for suffix in (b"", b"trailer", b"x", b"xy"):
            raw = prefix + value + suffix
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                out += [encode(raw), encode(raw).rstrip(b"=")]
    return out


def assert_clean(data: bytes, value: bytes = VALUE) -> None:
    for form in text_forms(value):
        assert form not in data
    for decoded in b64_decodings(data):
        assert value not in decoded


# --- text forms ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", text_forms(VALUE))
def test_text_forms_become_the_placeholder(form: bytes) -> None:
    out, found = SCRUBBER.scrub(b'{"echo": "' + form + b'", "n": 1}')
    assert out == b'{"echo": "' + PH + b'", "n": 1}'
    assert found == {"api"}


def test_percent_encoding_with_spaces_and_mixed_case_hex() -> None:
    value = b"pass word/with spaces&more=1"
    scrubber = Scrubber([Secret("pw", value, PH)])
    for form in (quote_plus(value).encode(), quote(value, safe="").encode(), b"pass+word%2fwith%20spaces%26more%3d1"):
        out, found = scrubber.scrub(b"q=" + form + b"&x=1")
        assert (out, found) == (b"q=" + PH + b"&x=1", {"pw"}), form
    assert scrubber.scrub(b"pass+word%2fwith%20Spaces%26more%3D1") == (b"pass+word%2fwith%20Spaces%26more%3D1", set())


def test_json_escapes() -> None:
    value = b'tok"en/with\\specials\n<&>\xc3\xa9'
    scrubber = Scrubber([Secret("j", value, PH)])
    text = value.decode()
    for form in (json.dumps(text), json.dumps(text, ensure_ascii=False), json.dumps(text).replace("/", "\\/"),
                 json.dumps(text).replace("<", "\\u003c").replace("&", "\\u0026").replace(">", "\\u003E")):
        out, found = scrubber.scrub(b'{"v": ' + form.encode() + b"}")
        assert out == b'{"v": "' + PH + b'"}', form
        assert found == {"j"}


def test_nothing_to_find_leaves_bytes_alone() -> None:
    data = bytes(range(256)) * 4 + b"sk-live_4f9Qz7/Lm+Xc2Vb8Np3Rt6Yw1Kd5Hg0"  # one byte short of the value
    assert SCRUBBER.scrub(data) == (data, set())
    assert Scrubber([]).scrub(data) == (data, set())


# --- base64 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [b"", b"Z", b"ZZ"])  # the value's length mod 3
@pytest.mark.parametrize("prefix", [b"", b"u", b"us", b"use", b"user", b"user:"])
@pytest.mark.parametrize("suffix", [b"", b"trailer", b"x", b"xy", b"xyz"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
@pytest.mark.parametrize("padded", [True, False])
def test_base64_at_every_alignment(extra: bytes, prefix: bytes, suffix: bytes, encode: Callable[[bytes], bytes],
                                   padded: bool) -> None:
    value = VALUE + extra
    text = encode(prefix + value + suffix)
    if not padded:
        text = text.rstrip(b"=")
    out, found = Scrubber([Secret("api", value, PH)]).scrub(b'"' + text + b'"')
    assert found == {"api"}
    assert value not in out
    assert_clean(out, value)
    decoded = lenient_b64decode(out)
    # The bytes before the value and the whole placeholder survive; no bit of the value does.
    assert decoded.startswith(prefix + PH)
    if not suffix and padded:  # the value ended the text: it stays valid base64
        assert base64.b64decode(out.strip(b'"').replace(b"-", b"+").replace(b"_", b"/"), validate=True) == prefix + PH


@pytest.mark.parametrize("prefix", [b"", b"u", b"us"])
@pytest.mark.parametrize("suffix", [b"", b"rest of the text", b"x"])
def test_base64_round_trips_when_lengths_agree_mod_3(prefix: bytes, suffix: bytes) -> None:
    value = b"v" * (len(PH) + 3)  # len = len(PH) (mod 3): the bytes after stay in phase
    scrubber = Scrubber([Secret("v", value, PH)])
    out, found = scrubber.scrub(base64.b64encode(prefix + value + suffix))
    assert found == {"v"}
    assert out == base64.b64encode(prefix + PH + suffix)


def test_basic_credentials_echo_decodes_to_the_placeholder() -> None:
    for user in (b"", b"a", b"ab", b"user", b"admin"):
        header = base64.b64encode(user + b":" + VALUE)
        out, _ = SCRUBBER.scrub(header)
        assert base64.b64decode(out, validate=True) == user + b":" + PH


def test_base64_in_query_and_php_json() -> None:
    raw = b"\x00\xfb" + VALUE + b"\xff\xfe"  # bytes that give '+' and '/' in the text
    text = base64.b64encode(raw)
    assert b"+" in text or b"/" in text
    for form in (quote(text, safe="").encode(), text.replace(b"/", b"\\/")):
        out, found = SCRUBBER.scrub(b"x=" + form)
        assert found == {"api"}
        assert_clean(out.replace(b"%2B", b"+").replace(b"%2F", b"/").replace(b"%3D", b"=").replace(b"\\/", b"/"))


def test_unrelated_base64_untouched() -> None:
    text = base64.b64encode(b"user:not-the-value" * 10)
    assert SCRUBBER.scrub(text) == (text, set())


# --- several secrets, awkward values ---------------------------------------------------------------------------


def test_adjacent_occurrences_of_two_secrets() -> None:
    out, found = SCRUBBER.scrub(VALUE + OTHER + VALUE + b" " + OTHER + OTHER)
    assert out == PH + OTHER_PH + PH + b" " + OTHER_PH + OTHER_PH
    assert found == {"api", "gh"}


def test_overlapping_occurrences() -> None:
    a, b = b"alpha-123456-shared", b"shared-987654-omega"
    scrubber = Scrubber([Secret("a", a, b"PH_A_" + b"x" * 8), Secret("b", b, b"PH_B_" + b"y" * 8)])
    out, found = scrubber.scrub(b"<alpha-123456-shared-987654-omega>")
    assert out == b"<PH_A_xxxxxxxx-987654-omega>"  # leftmost wins; neither value is left whole
    assert found == {"a"}
    assert a not in out and b not in out
    same = Scrubber([Secret("r", b"abababab", b"PH_R")])
    assert same.scrub(b"abababababab") == (b"PH_Rabab", {"r"})


def test_a_value_that_is_a_prefix_of_another() -> None:
    short, long = b"prefix-value-0123", b"prefix-value-0123-and-more"
    scrubber = Scrubber([Secret("short", short, b"PH_SHORT"), Secret("long", long, b"PH_LONG")])
    assert scrubber.scrub(b"[" + long + b"]") == (b"[PH_LONG]", {"long"})
    assert scrubber.scrub(b"[" + short + b"-and-less]") == (b"[PH_SHORT-and-less]", {"short"})
    reversed_order = Scrubber([Secret("long", long, b"PH_LONG"), Secret("short", short, b"PH_SHORT")])
    assert reversed_order.scrub(b"[" + long + short + b"]") == (b"[PH_LONGPH_SHORT]", {"long", "short"})
    out, _ = scrubber.scrub(base64.b64encode(b"k:" + long))
    assert lenient_b64decode(out) == b"k:PH_LONG"


def test_values_with_regex_metacharacters() -> None:
    value = rb"a.b*c+d?(e)[f]{g}|h^$\i"
    scrubber = Scrubber([Secret("meta", value, b"PH_META")])
    assert scrubber.scrub(b"x" + value + b"y") == (b"xPH_METAy", {"meta"})
    near = rb"aXb*c+d?(e)[f]{g}|h^$\i"  # '.' must not match any byte
    assert scrubber.scrub(near) == (near, set())
    assert scrubber.scrub(quote(value, safe="").encode())[0] == b"PH_META"
    assert scrubber.scrub(json.dumps(value.decode()).encode())[0] == b'"PH_META"'
    assert scrubber.scrub(base64.b64encode(b"u:" + value))[1] == {"meta"}


def test_replacement_output_is_not_rescanned() -> None:
    # The placeholder of one secret spells another secret's value: a second pass would replace it again.
    scrubber = Scrubber([Secret("one", b"first-value-1", b"second-value-2"), Secret("two", b"second-value-2", b"Z")])
    assert scrubber.scrub(b"first-value-1") == (b"second-value-2", {"one"})


def test_short_values_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        Scrubber([Secret("short", b"1234567", PH)])


# --- streaming -------------------------------------------------------------------------------------------------

BODY = b"\n".join([
    b"start", *text_forms(VALUE), *base64_forms(VALUE)[::5],
    OTHER, base64.b64encode(b"x:" + OTHER), VALUE + OTHER, b"end",
])
WHOLE, WHOLE_FOUND = SCRUBBER.scrub(BODY)


def stream(scrubber: Scrubber, data: bytes, cuts: list[int]) -> tuple[bytes, set[str]]:
    streamer = StreamScrubber(scrubber)
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        out.append(streamer.feed(data[a:b]))
        assert len(streamer._held) <= scrubber.max_form_len - 1
    out.append(streamer.finish())
    return b"".join(out), streamer.found


def test_whole_body_is_clean() -> None:
    assert WHOLE_FOUND == {"api", "gh"}
    assert_clean(WHOLE)
    assert_clean(WHOLE, OTHER)


def test_every_single_chunk_boundary() -> None:
    for cut in range(len(BODY) + 1):
        assert stream(SCRUBBER, BODY, [cut]) == (WHOLE, WHOLE_FOUND), cut


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(BODY)), max_size=40))
def test_random_chunkings(cuts: list[int]) -> None:
    out, found = stream(SCRUBBER, BODY, sorted(cuts))
    assert out == WHOLE
    assert found == WHOLE_FOUND


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([VALUE, OTHER, b"", b" ", b"=", b"%", b"\\", b"A", b"/", b"noise"]), max_size=12),
    st.data(),
)
def test_random_bodies_and_chunkings(parts: list[bytes], data: st.DataObject) -> None:
    text = b"".join(parts)
    body = b"|".join([text, quote(text, safe="").encode(), base64.b64encode(text)])
    whole, found = SCRUBBER.scrub(body)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=20)))
    assert stream(SCRUBBER, body, cuts) == (whole, found)
    assert_clean(whole)
    assert_clean(whole, OTHER)


def regex_only(secrets: list[Secret]) -> Scrubber:
    """The same scrubber without the anchor prefilter: one combined regex over everything."""
    scrubber = Scrubber(secrets)
    scrubber._anchors = None
    return scrubber


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([VALUE, OTHER, VALUE[:20], OTHER[5:], b"Xc2Vb8Np3Rt6Yw1Kd5Hg0J", b"=", b"%2F", b"/"]),
             max_size=10),
    st.sampled_from([lambda b: b, lambda b: quote(b, safe="").encode(), base64.b64encode, base64.urlsafe_b64encode]),
)
def test_anchor_prefilter_finds_what_the_full_regex_finds(parts: list[bytes], encode: Callable[[bytes], bytes]) -> None:
    body = b"<" + encode(b"".join(parts)) + b">"
    secrets = [SECRET, Secret("gh", OTHER, OTHER_PH)]
    assert SCRUBBER.scrub(body) == regex_only(secrets).scrub(body)


def test_values_without_an_anchor_still_work() -> None:
    value = b"!@#$%^&*()+= "
    scrubber = Scrubber([Secret("sym", value, PH), SECRET])
    assert scrubber._anchors is None  # no run of 3 letters, digits or -._ to look for
    body = b"|".join([value, quote(value, safe="").encode(), quote_plus(value).encode(), base64.b64encode(value),
                      VALUE])
    out, found = scrubber.scrub(body)
    assert out == b"|".join([PH, PH, PH, base64.b64encode(PH), PH])
    assert found == {"sym", "api"}
    assert stream(scrubber, body, list(range(0, len(body), 3))) == (out, found)


def test_one_byte_chunks() -> None:
    assert stream(SCRUBBER, BODY, list(range(1, len(BODY)))) == (WHOLE, WHOLE_FOUND)


# --- header values ---------------------------------------------------------------------------------------------


def test_scrub_text_header_values() -> None:
    value = VALUE.decode()
    assert SCRUBBER.scrub_text(f"Bearer {value}") == (f"Bearer {PH.decode()}", {"api"})
    basic = "Basic " + base64.b64encode(b"me:" + VALUE).decode()
    out, found = SCRUBBER.scrub_text(basic)
    assert found == {"api"}
    assert base64.b64decode(out.removeprefix("Basic ")) == b"me:" + PH
    location = "https://example.com/cb?token=" + quote(value, safe="") + "&x=1"
    assert SCRUBBER.scrub_text(location) == (f"https://example.com/cb?token={PH.decode()}&x=1", {"api"})
    assert SCRUBBER.scrub_text("no secret here") == ("no secret here", set())


def test_scrub_text_keeps_undecodable_bytes() -> None:
    raw = b"caf\xe9 \xff " + VALUE  # not UTF-8: mitmproxy gives it with surrogate escapes
    text = raw.decode("utf-8", "surrogateescape")
    out, found = SCRUBBER.scrub_text(text)
    assert out.encode("utf-8", "surrogateescape") == b"caf\xe9 \xff " + PH
    assert found == {"api"}


def test_scrub_text_survives_lone_surrogates() -> None:
    out, found = SCRUBBER.scrub_text("\ud800 " + VALUE.decode())
    assert (out, found) == ("\ud800 " + PH.decode(), {"api"})


def test_scrub_text_non_ascii_value_as_utf8_and_as_latin1() -> None:
    value = "pässwörd-sécret".encode()
    scrubber = Scrubber([Secret("u", value, PH)])
    assert scrubber.scrub_text("x " + value.decode("utf-8")) == ("x " + PH.decode(), {"u"})
    assert scrubber.scrub_text("x " + value.decode("latin-1")) == ("x " + PH.decode(), {"u"})


# --- bodies ----------------------------------------------------------------------------------------------------

PLAIN = b"\n".join([b"<html>", *text_forms(VALUE), *base64_forms(OTHER)[:6], b"</html>"]) * 50


def compress(encoding: str, data: bytes) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        return gzip.compress(data)
    if encoding == "deflate":  # zlib-wrapped, as RFC 9110 says
        return zlib.compress(data)
    if encoding == "deflate-raw":  # what some servers send as deflate
        packer = zlib.compressobj(wbits=-15)
        return packer.compress(data) + packer.flush()
    if encoding == "br":
        return brotli.compress(data, quality=5)
    if encoding == "zstd":
        return zstd.compress(data)
    return data


ENCODINGS = ["gzip", "x-gzip", "deflate", "deflate-raw", "br", "zstd", "identity", None]
COMPRESSED = ["gzip", "x-gzip", "deflate", "deflate-raw", "br", "zstd"]


def header(encoding: str | None) -> str | None:
    return "deflate" if encoding == "deflate-raw" else encoding


def feed_all(body: BodyScrubber, data: bytes, rnd: random.Random, biggest: int = 700) -> bytes:
    out = []
    i = 0
    while i < len(data):
        size = rnd.randint(1, biggest)
        out.append(body.feed(data[i:i + size]))
        i += size
    out.append(body.finish())
    return b"".join(out)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("seed", range(3))
def test_compressed_bodies_come_out_decoded_and_scrubbed(encoding: str | None, seed: int) -> None:
    body = body_scrubber(SCRUBBER, header(encoding))
    out = feed_all(body, compress(encoding or "identity", PLAIN), random.Random(seed))
    assert (out, body.found) == SCRUBBER.scrub(PLAIN)
    assert_clean(out)
    assert_clean(out, OTHER)


@pytest.mark.parametrize("content_encoding", ["GZIP", " gzip ", "Br", "identity", "", None])
def test_content_encoding_is_case_and_space_insensitive(content_encoding: str | None) -> None:
    encoding = (content_encoding or "identity").strip().lower()
    data = compress(encoding, PLAIN)
    body = body_scrubber(SCRUBBER, content_encoding)
    assert body.feed(data) + body.finish() == SCRUBBER.scrub(PLAIN)[0]


def test_several_gzip_members_and_zstd_frames() -> None:
    body = body_scrubber(SCRUBBER, "gzip")
    data = gzip.compress(PLAIN[:1000]) + gzip.compress(PLAIN[1000:])
    assert feed_all(body, data, random.Random(1), 50) == SCRUBBER.scrub(PLAIN)[0]
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    body = body_scrubber(SCRUBBER, "zstd")
    data = zstd.compress(PLAIN[:1000]) + skippable + zstd.compress(PLAIN[1000:])
    assert feed_all(body, data, random.Random(1), 50) == SCRUBBER.scrub(PLAIN)[0]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_empty_body_is_empty_whatever_the_encoding(encoding: str) -> None:
    body = body_scrubber(SCRUBBER, encoding)
    assert body.feed(b"") + body.finish() == b""


@pytest.mark.parametrize("content_encoding", ["compress", "gzip, br", "br,gzip", "gzip, identity, br", "x-bogus",
                                              "gzip;q=1", "exi", "pack200-gzip", "aes128gcm"])
def test_unknown_or_stacked_encodings_are_refused(content_encoding: str) -> None:
    with pytest.raises(ScrubError):
        body_scrubber(SCRUBBER, content_encoding)


def feed_and_finish(body: BodyScrubber, data: bytes, chunk: int = 100) -> bytes:
    out = [body.feed(data[i:i + chunk]) for i in range(0, len(data), chunk)]
    return b"".join(out) + body.finish()


@pytest.mark.parametrize("encoding", COMPRESSED)
@pytest.mark.parametrize("garbage", [b"\x00garbage-not-a-stream" * 10, bytes(range(256)), b"plain, not compressed"])
def test_corrupt_streams_are_refused(encoding: str, garbage: bytes) -> None:
    with pytest.raises(ScrubError):
        feed_and_finish(body_scrubber(SCRUBBER, header(encoding)), garbage)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_corruption_in_the_middle_is_refused(encoding: str) -> None:
    data = bytearray(compress(encoding, PLAIN))
    data[len(data) // 2] ^= 0x55
    with pytest.raises(ScrubError):
        feed_and_finish(body_scrubber(SCRUBBER, encoding), bytes(data))


@pytest.mark.parametrize("encoding", COMPRESSED)
@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_truncated_streams_are_refused(encoding: str, keep: float) -> None:
    data = compress(encoding, PLAIN)
    cut = max(1, min(int(len(data) * keep), len(data) - 1))
    with pytest.raises(ScrubError, match=r"ends early|corrupt"):
        feed_and_finish(body_scrubber(SCRUBBER, header(encoding)), data[:cut])


@pytest.mark.parametrize("encoding", COMPRESSED)
@pytest.mark.parametrize("trailer", [b"garbage", b"\x00", b"\x1f", b"\x1f\x8b", b"\x28\xb5\x2f", b"\n"])
@pytest.mark.parametrize("separately", [False, True])
def test_bytes_after_the_end_are_refused(encoding: str, trailer: bytes, separately: bool) -> None:
    body = body_scrubber(SCRUBBER, header(encoding))
    data = compress(encoding, PLAIN)
    with pytest.raises(ScrubError):
        if separately:
            body.feed(data)
            body.feed(trailer)
            body.finish()
        else:
            feed_and_finish(body, data + trailer)


def test_refusal_sticks() -> None:
    body = body_scrubber(SCRUBBER, "gzip")
    with pytest.raises(ScrubError):
        body.feed(b"not gzip at all")
    with pytest.raises(ScrubError):
        body.feed(gzip.compress(b"fine"))
    with pytest.raises(ScrubError):
        body.finish()


def test_zstd_window_beyond_rfc_9659_is_refused() -> None:
    packer = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 25})
    # Streamed (size unknown), so the frame asks for the whole 32 MiB window.
    data = packer.compress(PLAIN, zstd.ZstdCompressor.CONTINUE) + packer.flush()
    with pytest.raises(ScrubError, match="memory"):
        feed_and_finish(body_scrubber(SCRUBBER, "zstd"), data)
    packer = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 23})
    data = packer.compress(PLAIN, zstd.ZstdCompressor.CONTINUE) + packer.flush()
    assert feed_and_finish(body_scrubber(SCRUBBER, "zstd"), data) == SCRUBBER.scrub(PLAIN)[0]


def test_decompression_bomb_is_refused_early() -> None:
    bomb = gzip.compress(bytes(50 * 1024 * 1024), compresslevel=9)
    body = body_scrubber(SCRUBBER, "gzip", max_ratio=10)
    pieces = []
    with pytest.raises(ScrubError, match="bomb"):
        for i in range(0, len(bomb), 1024):
            pieces.append(body.feed(bomb[i:i + 1024]))
        body.finish()
    # Refused after about max_ratio x input + 1 MiB, long before the 50 MB.
    assert sum(map(len, pieces)) <= 10 * len(bomb) + 1024 * 1024
    assert all(len(piece) <= 1024 * 1024 + 2 * STEP for piece in pieces)


@pytest.mark.parametrize("encoding", ["deflate", "br", "zstd"])
def test_other_bombs_are_refused(encoding: str) -> None:
    data = compress(encoding, bytes(8 * 1024 * 1024))
    with pytest.raises(ScrubError, match="bomb"):
        feed_and_finish(body_scrubber(SCRUBBER, encoding, max_ratio=2), data, 1024)


def test_high_but_honest_ratio_passes() -> None:
    plain = (b"a" * 4000 + VALUE) * 500  # about 2 MB, compresses well over 100x
    body = body_scrubber(SCRUBBER, "gzip")
    out = feed_and_finish(body, gzip.compress(plain), 512)
    assert out == (b"a" * 4000 + PH) * 500


@pytest.mark.parametrize("encoding", COMPRESSED)
def test_output_comes_incrementally(encoding: str) -> None:
    """Each feed returns about what its chunk decodes to: nothing accumulates until finish()."""
    rnd = random.Random(7)
    words = [bytes(rnd.choices(b"abcdefghijklmnopqrstuvwxyz", k=rnd.randint(1, 9))) for _ in range(300)]
    plain = b"\n".join(b" ".join(rnd.choices(words, k=300)) + b" " + VALUE for _ in range(1500))  # ~2 MB
    data = compress(encoding, plain)
    body = body_scrubber(SCRUBBER, header(encoding))
    chunk = 256
    pieces = [body.feed(data[i:i + chunk]) for i in range(0, len(data), chunk)]
    rest = body.finish()
    assert len(rest) < SCRUBBER.max_form_len + len(PH)  # the held back bytes, scrubbed
    assert b"".join(pieces) + rest == plain.replace(VALUE, PH)
    biggest = max(map(len, pieces))
    # Deflate cannot expand beyond ~1032x; brotli may hand back one buffered meta-block step at a time.
    assert biggest <= max(chunk * 1032, 2 * STEP) + SCRUBBER.max_form_len


@pytest.mark.parametrize("encoding", COMPRESSED)
def test_decompression_steps_are_bounded(encoding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One chunk that decodes to megabytes reaches the scrubber in steps of about STEP bytes."""
    sizes: list[int] = []
    real_feed = StreamScrubber.feed

    def recording_feed(self: StreamScrubber, chunk: bytes) -> bytes:
        sizes.append(len(chunk))
        return real_feed(self, chunk)

    monkeypatch.setattr(scrub_module.StreamScrubber, "feed", recording_feed)
    plain = bytes(6 * 1024 * 1024)
    body = body_scrubber(SCRUBBER, header(encoding), max_ratio=1_000_000)  # zeros: far beyond any honest ratio
    assert len(body.feed(compress(encoding, plain)) + body.finish()) == len(plain)
    assert len(sizes) >= 6 * 1024 * 1024 // (2 * STEP)
    assert max(sizes) <= 2 * STEP  # zlib and zstd give exactly STEP; brotli rounds up to its blocks
