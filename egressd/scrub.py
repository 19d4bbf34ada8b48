"""Replacing injected secret values by their placeholders in replies; pure, no I/O.

Every form of every value below is replaced by the secret's placeholder, in one left-to-right pass: at each
position the longest match of any form wins, and the scan resumes after it, so a replacement is never
rescanned. Forms of a value (all precomputed by `Scrubber`):

* raw: the bytes as they are.
* percent-encoded: each byte as `%XX` (hex digits in either case, mixed too) or as itself (except `%` and
  `+`, which mean something else there), a space also as `+`. This covers `quote(v, safe="")`, `quote_plus`,
  upper- and lower-case hex, and encoders that leave `/`, `~`, `!`... unencoded. Letters, digits, `-`, `.`
  and `_` only as themselves: they are unreserved (RFC 3986) and no usual encoder touches them.
* JSON string contents: each character as itself (unless `"`, `\\` or a control character), its short escape
  (`\\"`, `\\\\`, `\\/`, `\\n`...) or `\\uXXXX` (either case; a surrogate pair above U+FFFF); letters,
  digits, `-`, `.` and `_` only as themselves. Not only for values with `/` or `"`: Go escapes `<>&`, every
  encoder escapes control characters and (in ASCII mode) non-ASCII ones, and a pattern per character is cheap.
* base64, standard and URL-safe alphabets (alike), padded or not, the value starting at any of the three
  byte positions of a 3-byte group of a longer base64 text. The characters made only of the value's bits (the
  core) are replaced by the placeholder's core at the same alignment. The character before the core that
  shares bits with the preceding bytes (lead) and the one after that shares bits with the following bytes
  (trail) are matched too when they carry the value's bits: the lead keeps the preceding bytes' bits and takes
  the placeholder's, the trail gets the placeholder's last bits. So no bit of the value survives, and the text
  decodes to the preceding bytes followed by the whole placeholder. What follows decodes intact only when
  len(value) = len(placeholder) (mod 3); otherwise it is shifted (the length change cannot be absorbed without
  re-encoding the rest of the text). Padding follows the original: re-counted when it had `=`; added when the
  value ended on a group boundary at the end of the base64 text (no padding was needed, the placeholder may
  need some) unless URL-safe characters show an unpadded alphabet. `+`, `/` and `=` are also recognised as
  `%2B`, `%2F`, `%3D` (base64 in a query) and `/` as `\\/` (base64 in a JSON string from PHP).

Not recognised: base64 broken into lines, hex, HTML entities, nested encodings beyond the above. The goal is
to catch a server echoing what it received, not a server determined to smuggle a value out (it could encode
it in countless ways). When two different values' occurrences overlap, the leftmost wins and the rest of the
other stays: neither appears whole.

Speed: every form contains a literal anchor (the value's longest run of letters, digits, `-._`; a base64
core's longest run of letters and digits), found with bytes.find; the regex runs only around anchors. Values
with no anchor of MIN_ANCHOR_LEN bytes fall back to one combined regex over everything, about 100x slower.

Bodies (`BodyScrubber`) are decoded per Content-Encoding and returned as identity bytes; anything that cannot
be decoded with certainty (unknown or stacked encodings, corrupt or truncated streams, trailing bytes, a
decompression bomb) raises `ScrubError` so the reply is refused rather than passed through.
"""

import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import brotli

try:  # the standard library from Python 3.14; the backport (same API, mitmproxy brings it) before
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]

MIN_VALUE_LEN = 8  # shorter values would give base64 cores of a few characters that match by chance
MIN_ANCHOR_LEN = 3  # shorter anchors would be found too often to save time
STEP = 256 * 1024  # decoded bytes asked of a decompressor per step: bounds what one step allocates
BOMB_ALLOWANCE = 1024 * 1024  # decoded bytes allowed beyond max_ratio x compressed bytes
ZSTD_WINDOW_LOG_MAX = 23  # RFC 9659: zstd in HTTP uses at most an 8 MiB window; larger would cost memory


class ScrubError(Exception):
    """The reply cannot be scrubbed safely (unknown encoding, corrupt stream, bomb)."""


@dataclass(frozen=True)
class Secret:
    """What to hide (value) and what to show instead (placeholder)."""

    name: str
    value: bytes  # non-empty, at least MIN_VALUE_LEN bytes
    placeholder: bytes  # ASCII


# --- base64 -------------------------------------------------------------------------------------------------

_B64_STD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_URL = _B64_STD[:62] + b"-_"
_SEXTET: dict[bytes, int] = (
    {bytes([c]): i for i, c in enumerate(_B64_STD)}
    | {b"-": 62, b"_": 63, b"%2B": 62, b"%2b": 62, b"%2F": 63, b"%2f": 63, b"\\/": 63}
)
_SPECIAL = {62: rb"\+|%2[bB]|-", 63: rb"/|\\/|%2[fF]|_"}  # both alphabets, also percent- and JSON-escaped
_PAD = rb"(?:=|%3[dD])"
_B64_NEXT = rb"[A-Za-z0-9+/_=-]|%2[bBfF]|%3[dD]|\\/"  # what continues a base64 text
_PAD_COUNT = {0: 0, 2: 2, 4: 1}  # by the bits left in the last character: '==' after 1 byte, '=' after 2


@dataclass(frozen=True)
class _Layout:
    """Where a byte string's bits fall in base64 text when it starts k bytes into a 3-byte group."""

    lead_bits: int  # its first bits, sharing a character with the bytes before (0, 4 or 2 for k = 0, 1, 2)
    lead: int  # their value
    core: tuple[int, ...]  # the characters made only of its bits, as sextets
    trail_bits: int  # its last bits, sharing a character with the bytes after (0, 2 or 4)
    trail: int  # their value


def _layout(data: bytes, k: int) -> _Layout:
    total = 8 * len(data)
    bits = int.from_bytes(data, "big")

    def take(start: int, count: int) -> int:
        return (bits >> (total - start - count)) & ((1 << count) - 1)

    lead_bits = (-8 * k) % 6
    trail_bits = (8 * (k + len(data))) % 6
    core = tuple(take(lead_bits + 6 * i, 6) for i in range((total - lead_bits - trail_bits) // 6))
    return _Layout(lead_bits, take(0, lead_bits), core, trail_bits, take(total - trail_bits, trail_bits))


def _sextets_pattern(sextets: Iterable[int]) -> tuple[bytes, int]:
    """A pattern for one base64 character among these sextets, and its longest match."""
    chosen = set(sextets)
    plain = bytes(_B64_STD[i] for i in sorted(chosen) if i < 62)
    alternatives = [b"[" + plain + b"]"] if plain else []
    alternatives += [_SPECIAL[i] for i in (62, 63) if i in chosen]
    return b"(?:" + b"|".join(alternatives) + b")", 3 if chosen & {62, 63} else 1


@dataclass(frozen=True)
class _Base64:
    value: _Layout
    placeholder: _Layout


def _base64_pattern(layout: _Layout, named: bool) -> tuple[bytes, int]:
    def group(name: bytes) -> bytes:
        return b"(?P<" + name + b">" if named else b"(?:"

    parts: list[bytes] = []
    longest = 0
    if layout.lead_bits:
        mask = (1 << layout.lead_bits) - 1
        pattern, size = _sextets_pattern(c for c in range(64) if c & mask == layout.lead)
        parts.append(group(b"lead") + pattern + b")?")
        longest += size
    for sextet in layout.core:
        pattern, size = _sextets_pattern([sextet])
        parts.append(pattern)
        longest += size
    if layout.trail_bits:
        shift = 6 - layout.trail_bits
        pattern, size = _sextets_pattern(c for c in range(64) if c >> shift == layout.trail)
        parts.append(b"(?:" + group(b"trail") + pattern + b")" + group(b"pad") + _PAD + b"{1,2})?)?")
        longest += size + 6
    else:  # 'end' takes part when the base64 text ends right after the value (a 3-byte peek: '%2B')
        parts.append(b"(?:" + group(b"end") + b")(?!" + _B64_NEXT + b"))?")
        longest += 3
    return b"".join(parts), longest


def _base64_replacement(form: _Base64, match: re.Match[bytes]) -> bytes:
    text = match.group(0)
    value, placeholder = form.value, form.placeholder
    sextets: list[int] = []
    lead = match.group("lead") if value.lead_bits else None
    if lead is not None:  # keep the bits of the bytes before, put the placeholder's in place of the value's
        mask = (1 << value.lead_bits) - 1
        sextets.append((_SEXTET[lead] & ~mask & 63) | placeholder.lead)
    sextets.extend(placeholder.core)
    if placeholder.trail_bits:
        shift = 6 - placeholder.trail_bits
        fill = 0
        trail = match.group("trail") if value.trail_bits else None
        if trail is not None and value.trail_bits == placeholder.trail_bits:  # the bytes after stay in phase
            fill = _SEXTET[trail] & ((1 << shift) - 1)
        sextets.append((placeholder.trail << shift) | fill)
    urlsafe = b"-" in text or b"_" in text
    pad = 0
    if value.trail_bits:
        if match.group("pad"):
            pad = _PAD_COUNT[placeholder.trail_bits]
    elif match.group("end") is not None and not urlsafe:
        pad = _PAD_COUNT[placeholder.trail_bits]
    out = bytes((_B64_URL if urlsafe else _B64_STD)[s] for s in sextets)
    if b"%" in text:  # base64 inside a query: keep it percent-encoded
        return out.replace(b"+", b"%2B").replace(b"/", b"%2F") + b"%3D" * pad
    return out + b"=" * pad


# --- percent and JSON ---------------------------------------------------------------------------------------


# Letters, digits, '-', '.' and '_' are unreserved (RFC 3986): quote() and the usual encoders leave them as they
# are, and JSON never escapes them. Taking them as literal gives every text form a long literal anchor.
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._")


def _hex_pattern(number: int, digits: int) -> bytes:
    """Hex digits matching in either case, one by one."""
    return b"".join(
        bytes([c]) if c < 0x40 else b"[" + bytes([c, c + 0x20]) + b"]"
        for c in f"{number:0{digits}X}".encode()
    )


def _percent_pattern(value: bytes) -> tuple[bytes, int]:
    parts = []
    for byte in value:
        if byte in _PLAIN:
            parts.append(bytes([byte]))
            continue
        alternatives = [b"%" + _hex_pattern(byte, 2)]
        if byte == 0x20:
            alternatives.append(rb"\+")
        if byte not in b"%+":  # a bare '%' or '+' means something else in percent-encoded text
            alternatives.append(re.escape(bytes([byte])))
        parts.append(b"(?:" + b"|".join(alternatives) + b")")
    return b"".join(parts), 3 * len(value)


_JSON_SHORT = {'"': b'\\"', "\\": b"\\\\", "/": b"\\/", "\b": b"\\b", "\f": b"\\f", "\n": b"\\n", "\r": b"\\r",
               "\t": b"\\t"}


def _json_units(value: bytes) -> Iterator[tuple[bytes, int | None]]:
    """The value's characters as (bytes, code point), or (byte, None) for bytes that are not UTF-8."""
    try:
        for char in value.decode("utf-8"):
            yield char.encode("utf-8"), ord(char)
    except UnicodeDecodeError:
        for byte in value:
            yield bytes([byte]), byte if byte < 0x80 else None


def _json_pattern(value: bytes) -> tuple[bytes, int]:
    parts = []
    longest = 0
    for raw, code in _json_units(value):
        if code is None or code in _PLAIN:
            parts.append(re.escape(raw))
            longest += 1
            continue
        alternatives = []
        if code >= 0x20 and raw not in (b'"', b"\\"):
            alternatives.append(re.escape(raw))
        short = _JSON_SHORT.get(chr(code))
        if short:
            alternatives.append(re.escape(short))
        if code < 0x10000:
            alternatives.append(rb"\\u" + _hex_pattern(code, 4))
            size = 6
        else:
            high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
            alternatives.append(rb"\\u" + _hex_pattern(high, 4) + rb"\\u" + _hex_pattern(low, 4))
            size = 12
        parts.append(b"(?:" + b"|".join(alternatives) + b")")
        longest += max(size, len(raw))
    return b"".join(parts), longest


# --- the scrubber -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Form:
    secret: Secret
    pattern: re.Pattern[bytes]
    source: bytes  # the pattern without group names, for the combined search
    longest: int  # the most bytes a match can span (or look at)
    anchor: bytes  # bytes every match contains, found with bytes.find (far faster than any regex)
    base64: _Base64 | None  # None: replaced by the placeholder as it is


def _longest_run(data: bytes, characters: bytes) -> bytes:
    """The longest run of these characters (a regex class body) in data."""
    return max(re.findall(b"[" + characters + b"]+", data), key=len, default=b"")


def _forms(secret: Secret) -> Iterator[_Form]:
    value = secret.value
    anchor = _longest_run(value, rb"A-Za-z0-9._\-")  # _PLAIN: literal in every text form
    for source, longest in [(re.escape(value), len(value)), _percent_pattern(value), _json_pattern(value)]:
        yield _Form(secret, re.compile(source), source, longest, anchor, None)
    for k in range(3):
        layout = _layout(value, k)
        named, longest = _base64_pattern(layout, named=True)
        source, _ = _base64_pattern(layout, named=False)
        core = bytes(_B64_STD[s] for s in layout.core)
        form = _Base64(layout, _layout(secret.placeholder, k))
        yield _Form(secret, re.compile(named), source, longest, _longest_run(core, b"A-Za-z0-9"), form)


class Scrubber:
    """Every form of every value (see the module's doc) → its secret's placeholder."""

    def __init__(self, secrets: Sequence[Secret]) -> None:
        for secret in secrets:
            if len(secret.value) < MIN_VALUE_LEN:
                raise ValueError(f"secret {secret.name!r}: a value must have at least {MIN_VALUE_LEN} bytes")
            if not secret.placeholder or not secret.placeholder.isascii():
                raise ValueError(f"secret {secret.name!r}: the placeholder must be non-empty ASCII")
        # Longer values first: when two match equally long at one place the earlier form wins.
        ordered = sorted(secrets, key=lambda s: -len(s.value))
        self._forms = [form for secret in ordered for form in _forms(secret)]
        self._search = re.compile(b"|".join(f.source for f in self._forms)) if self._forms else None
        self._max_form_len = max((f.longest for f in self._forms), default=1)
        anchors = {f.anchor for f in self._forms}
        # Without an anchor of a few bytes for every form, the combined regex scans everything (~100x slower).
        self._anchors = tuple(anchors) if all(len(a) >= MIN_ANCHOR_LEN for a in anchors) else None
        self._latin1 = any(not s.value.isascii() for s in secrets)

    @property
    def max_form_len(self) -> int:
        """The most bytes one replacement depends on: a stream holds back one fewer."""
        return self._max_form_len

    def scrub(self, data: bytes) -> tuple[bytes, set[str]]:
        """A whole buffer (a header block, a small body): the scrubbed bytes and the names found."""
        found: set[str] = set()
        out, _ = self._scan(data, True, found)
        return out, found

    def scrub_text(self, text: str) -> tuple[str, set[str]]:
        """A header value as mitmproxy gives it: bytes decoded as UTF-8 with surrogateescape, which maps every
        byte sequence to a str and back exactly, so the value's own bytes are what is searched. Text that was
        decoded as latin-1 instead is searched that way too, when some value is not ASCII (an ASCII value has
        the same bytes either way)."""
        errors = "surrogateescape"
        try:
            data = text.encode("utf-8", errors)
        except UnicodeEncodeError:  # a lone surrogate no byte decodes to: keep it through the round trip
            errors = "surrogatepass"
            data = text.encode("utf-8", errors)
        out, found = self.scrub(data)
        result = out.decode("utf-8", errors)
        if self._latin1 and not result.isascii():
            try:
                raw = result.encode("latin-1")
            except UnicodeEncodeError:  # not latin-1 text
                return result, found
            out, more = self.scrub(raw)
            if more:
                result, found = out.decode("latin-1"), found | more
        return result, found

    def _scan(self, buf: bytes, final: bool, found: set[str]) -> tuple[bytes, bytes]:
        """Scrubbed output and the tail held back: without more data (final=False) only matches starting
        max_form_len or more bytes before the end are decided, since a match starting later may grow."""
        if self._search is None:
            return buf, b""
        limit = len(buf) if final else len(buf) - self._max_form_len + 1
        starts = self._starts(buf)
        pieces = []
        pos = 0
        while (start := starts(pos)) is not None and start < limit:
            end, replacement, name = self._replace_at(buf, start)
            pieces += [buf[pos:start], replacement]
            found.add(name)
            pos = end
        cut = len(buf) if final else max(pos, limit)
        pieces.append(buf[pos:cut])
        return b"".join(pieces), buf[cut:]

    def _starts(self, buf: bytes) -> Callable[[int], int | None]:
        """For buf: where the leftmost match at or after a position starts, or None."""
        search = self._search
        assert search is not None
        anchors = self._anchors
        if anchors is None:
            def start_by_regex(pos: int) -> int | None:
                match = search.search(buf, pos)
                return None if match is None else match.start()
            return start_by_regex

        span = self._max_form_len
        nowhere = len(buf) + 1
        next_at = [-1] * len(anchors)  # each anchor's next occurrence; searched again once passed

        def start_by_anchor(pos: int) -> int | None:
            while True:
                for i, anchor in enumerate(anchors):
                    if next_at[i] < pos:
                        found_at = buf.find(anchor, pos)
                        next_at[i] = nowhere if found_at < 0 else found_at
                at = min(next_at)
                if at == nowhere:
                    return None
                # Every match contains its anchor, so none starts before at - span, and one starting at or
                # before this anchor ends by at + span.
                match = search.search(buf, max(pos, at - span), min(len(buf), at + span))
                if match is not None and match.start() <= at:
                    return match.start()
                pos = at + 1

        return start_by_anchor

    def _replace_at(self, buf: bytes, start: int) -> tuple[int, bytes, str]:
        """The longest match of any form at start: where it ends, what replaces it, whose it is."""
        best: tuple[re.Match[bytes], _Form] | None = None
        for form in self._forms:
            match = form.pattern.match(buf, start)
            if match is not None and (best is None or match.end() > best[0].end()):
                best = match, form
        assert best is not None  # the combined search matched here, so one form does
        match, form = best
        if form.base64 is None:
            return match.end(), form.secret.placeholder, form.secret.name
        return match.end(), _base64_replacement(form.base64, match), form.secret.name


class StreamScrubber:
    """Scrubs a body given in chunks of any size; holds back at most max_form_len-1 bytes between calls.
    The joined output equals Scrubber.scrub of the joined input."""

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._held = b""
        self.found: set[str] = set()

    def feed(self, chunk: bytes) -> bytes:
        """The output that can no longer be part of a match."""
        out, self._held = self._scrubber._scan(self._held + chunk, False, self.found)
        return out

    def finish(self) -> bytes:
        """The rest."""
        out, _ = self._scrubber._scan(self._held, True, self.found)
        self._held = b""
        return out


# --- bodies -------------------------------------------------------------------------------------------------


class _Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def finish(self) -> None:
        pass


class _Zlib:
    """gzip (one member or several, back to back) or deflate (zlib-wrapped as RFC 9110 says, or raw as some
    servers send it: told apart by the zlib header's check bits, as browsers do)."""

    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._decoder: zlib._Decompress | None = None
        self._pending = b""  # too few bytes yet to tell how a stream starts
        self._ended = False  # a stream ended; only another gzip member may follow

    def feed(self, data: bytes) -> Iterator[bytes]:
        data, self._pending = self._pending + data, b""
        while data:
            if self._decoder is None:
                if len(data) < 2:
                    self._pending = data
                    return
                if self._ended and not (self._gzip and data.startswith(b"\x1f\x8b")):
                    raise ScrubError("bytes after the end of the compressed stream")
                self._decoder = zlib.decompressobj(self._wbits(data))
                self._ended = False
            decoder = self._decoder
            out = decoder.decompress(data, STEP)
            while True:
                if out:
                    yield out
                if decoder.eof:
                    data, self._decoder, self._ended = decoder.unused_data, None, True
                    break
                if not decoder.unconsumed_tail and len(out) < STEP:  # all input in, all output out
                    data = b""
                    break
                out = decoder.decompress(decoder.unconsumed_tail, STEP)

    def _wbits(self, head: bytes) -> int:
        if self._gzip:
            return 16 + zlib.MAX_WBITS
        zlib_header = head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and int.from_bytes(head[:2], "big") % 31 == 0
        return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS

    def finish(self) -> None:
        if self._decoder is not None or (self._pending and not self._ended):
            raise ScrubError("the compressed stream ends early")
        if self._pending:
            raise ScrubError("bytes after the end of the compressed stream")


class _Brotli:
    def __init__(self) -> None:
        self._decoder = brotli.Decompressor()
        self._started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        if self._decoder.is_finished():
            raise ScrubError("bytes after the end of the compressed stream")
        self._started = True
        out = self._decoder.process(data, output_buffer_limit=STEP)  # trailing bytes in data: brotli.error
        while out:
            yield out
            if self._decoder.is_finished():
                return
            out = self._decoder.process(b"", output_buffer_limit=STEP)  # empty until more input comes

    def finish(self) -> None:
        if self._started and not self._decoder.is_finished():
            raise ScrubError("the compressed stream ends early")


def _zstd_frame_start(head: bytes) -> bool:
    """A zstd frame's magic number, or a skippable frame's (0x184D2A5?), little-endian."""
    return head == b"\x28\xb5\x2f\xfd" or (head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18")


class _Zstd:
    """One frame or several back to back (skippable frames too), as RFC 8878 allows."""

    def __init__(self) -> None:
        self._decoder: zstd.ZstdDecompressor | None = None
        self._pending = b""  # after a frame: too few bytes yet to see whether another starts
        self._ended = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        data, self._pending = self._pending + data, b""
        while data:
            if self._decoder is None:
                if self._ended:
                    if len(data) < 4:
                        self._pending = data
                        return
                    if not _zstd_frame_start(data[:4]):
                        raise ScrubError("bytes after the end of the compressed stream")
                options = {zstd.DecompressionParameter.window_log_max: ZSTD_WINDOW_LOG_MAX}
                self._decoder = zstd.ZstdDecompressor(options=options)
                self._ended = False
            decoder = self._decoder
            out = decoder.decompress(data, STEP)
            while True:
                if out:
                    yield out
                if decoder.eof:
                    data, self._decoder, self._ended = decoder.unused_data, None, True
                    break
                if decoder.needs_input:
                    data = b""
                    break
                out = decoder.decompress(b"", STEP)

    def finish(self) -> None:
        if self._decoder is not None:
            raise ScrubError("the compressed stream ends early")
        if self._pending:
            raise ScrubError("bytes after the end of the compressed stream")


_DECODERS = {
    "gzip": lambda: _Zlib(gzip=True),
    "x-gzip": lambda: _Zlib(gzip=True),
    "deflate": lambda: _Zlib(gzip=False),
    "br": _Brotli,
    "zstd": _Zstd,
}
_DECODE_ERRORS = (zlib.error, brotli.error, zstd.ZstdError, EOFError)


class BodyScrubber:
    """Decodes the body per Content-Encoding (streaming: gzip/x-gzip, deflate (zlib-wrapped or raw), br, zstd,
    identity/absent), scrubs the decoded bytes with a StreamScrubber, and yields IDENTITY bytes: the caller
    removes Content-Encoding and Content-Length from the reply. Unknown or stacked encodings raise ScrubError
    at construction; a corrupt stream, bytes after its end, a stream that ends early (finish() before its
    end), or more than max_ratio x input + 1 MiB of output (a bomb) raise ScrubError from feed()/finish(),
    and every later call raises it again. An empty body is accepted whatever its encoding.

    Memory: decompressors are asked for at most STEP bytes at a time, each piece is scrubbed and only
    max_form_len-1 bytes are held back; what one feed() returns is bounded by what its chunk decodes to (at
    most max_ratio x all input + 1 MiB), so callers bound it by the chunk size they feed."""

    def __init__(self, scrubber: Scrubber, content_encoding: str | None = None, max_ratio: int = 1000) -> None:
        if max_ratio < 1:
            raise ValueError("max_ratio must be at least 1")
        codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1:
            raise ScrubError(f"stacked content encodings are not supported: {content_encoding!r}")
        if codings and codings[0] not in _DECODERS:
            raise ScrubError(f"unknown content encoding: {content_encoding!r}")
        self._decoder: _Identity | _Zlib | _Brotli | _Zstd = _DECODERS[codings[0]]() if codings else _Identity()
        self._bounded = bool(codings)  # identity cannot expand
        self._max_ratio = max_ratio
        self._stream = StreamScrubber(scrubber)
        self.found = self._stream.found  # the same set, kept up to date
        self._read = 0
        self._decoded = 0
        self._error: ScrubError | None = None
        self._finished = False

    def feed(self, chunk: bytes) -> bytes:
        self._check()
        self._read += len(chunk)
        return self._run(lambda: self._decoder.feed(chunk))

    def finish(self) -> bytes:
        self._check()
        self._finished = True
        out = self._run(self._finish_decoder)
        return out + self._stream.finish()

    def _finish_decoder(self) -> Iterator[bytes]:
        self._decoder.finish()
        return iter(())

    def _check(self) -> None:
        if self._error is None and self._finished:
            self._error = ScrubError("the body was already finished")
        if self._error is not None:  # a refused body stays refused, whatever comes next
            raise ScrubError(str(self._error))

    def _run(self, pieces_of: Callable[[], Iterator[bytes]]) -> bytes:
        out = []
        try:
            for piece in pieces_of():
                self._decoded += len(piece)
                if self._bounded and self._decoded > self._max_ratio * self._read + BOMB_ALLOWANCE:
                    raise ScrubError(f"decodes to more than {self._max_ratio} times its size (a bomb?)")
                out.append(self._stream.feed(piece))
        except ScrubError as err:
            self._error = err
            raise
        except _DECODE_ERRORS as err:
            self._error = ScrubError(f"corrupt compressed stream: {err}")
            raise self._error from err
        return b"".join(out)


def body_scrubber(scrubber: Scrubber, content_encoding: str | None, max_ratio: int = 1000) -> BodyScrubber:
    """A BodyScrubber for a reply with this Content-Encoding; ScrubError when it cannot be decoded."""
    return BodyScrubber(scrubber, content_encoding, max_ratio)
