"""Credentials kept out of sight: every masking of a secret lives here.

:func:`redact_url` for a URL shown on purpose, :func:`redact` and :func:`scrub`
for any text that may quote one (an error message, a log line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus, urlsplit


def url_secrets(url: str | None) -> list[str]:
    """The credential strings of a URL, raw and percent-decoded, longest first."""
    if not url:
        return []
    _, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return []
    # up to the last '@': an unescaped '/', '?' or '#' in a password ends urlsplit's netloc early
    userinfos = {rest.rsplit("@", 1)[0]}
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = ""
    if "@" in netloc:
        userinfos.add(netloc.rsplit("@", 1)[0])
    secrets = set()
    for userinfo in userinfos:
        for value in (userinfo, userinfo.partition(":")[2]):
            secrets |= {value, unquote(value), unquote_plus(value)}  # pymongo decodes with unquote_plus
    return sorted((s for s in secrets if s), key=len, reverse=True)


def redact_url(url: str | None) -> str:
    """The URL with its user and password replaced, safe for logs and metadata."""
    if not url:
        return "(embedded default)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***:***@" + netloc.rsplit("@", 1)[1]
    elif "@" in url.partition("://")[2]:  # an unescaped '/', '?' or '#' in the password
        return redact_url(f"{parts.scheme}://***:***@{url.rsplit('@', 1)[1]}")
    return f"{parts.scheme}://{netloc}{parts.path}"


def redact(text: str, urls: Iterable[str | None]) -> str:
    """``text`` with every credential of ``urls`` masked."""
    for url in urls:
        for secret in url_secrets(url):
            text = text.replace(secret, "***")
    return text


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def scrub(text: str, urls: Iterable[str | None] = ()) -> str:
    """``text`` without the credentials of ``urls``, nor any ``user:password@`` of any URL in it."""
    return _USERINFO.sub(r"\g<scheme>***@", redact(text, urls))


def scheme_and_host(url: str) -> str:
    """Scheme, host and port only: what is shown of a webhook's URL, whose credentials, path and query often carry
    its secret token."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparseable URL)"
    if not parts.scheme or not host:
        return "(not a URL)"
    return f"{parts.scheme}://{host}{port}/…"
