"""POSTing JSON to an operator's URL (failure alerts, compensations), through ``requests``.

A webhook URL often carries its secret: a ``user:token@`` part, or a token in its
path or query. The credentials of ``user:token@host`` are sent as HTTP Basic auth
(decoded, as a browser would), never as part of the host name, and no error this
module raises shows more of the URL than its scheme, host and port.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import requests

from zombie_pipeline.queue.secrets import scheme_and_host

#: What a webhook URL may start with.
SCHEMES = ("http", "https")


class WebhookError(RuntimeError):
    """The POST failed or was refused; the message names the URL by scheme and host only."""


def _without_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without its ``user:password@``, and those credentials decoded (None when there are none)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rsplit("@", 1)[1]
    credentials = (unquote(parts.username or ""), unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=netloc)), credentials


def post_json(
    url: str, payload: Mapping[str, Any], timeout_seconds: float, headers: Mapping[str, str] | None = None
) -> int:
    """POST ``payload`` as JSON; the HTTP status of a 2xx answer. Anything else raises :class:`WebhookError`."""
    where = scheme_and_host(url)
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme not in SCHEMES:
        raise WebhookError(f"the webhook URL must start with http:// or https://, got {where}")
    target, auth = _without_credentials(url)
    try:
        response = requests.post(
            target,
            data=json.dumps(payload, default=str),
            headers={"Content-Type": "application/json", **(headers or {})},
            auth=auth,
            timeout=timeout_seconds,
            allow_redirects=False,  # a redirect would carry the body (and the auth) to a host nobody configured
        )
    except requests.Timeout:
        raise WebhookError(f"POST {where} failed: no answer within {timeout_seconds:g} s") from None
    except requests.RequestException as error:
        raise WebhookError(f"POST {where} failed: {_cause(error)}") from None
    if not 200 <= response.status_code < 300:
        raise WebhookError(f"POST {where} answered {response.status_code}")
    return response.status_code


_OS_ERROR = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def _cause(error: requests.RequestException) -> str:
    """What went wrong, without the URL requests quotes in its messages (its path may be the secret)."""
    found = _OS_ERROR.search(str(error))
    return f"{type(error).__name__}: {found.group(0).strip()}" if found else type(error).__name__
