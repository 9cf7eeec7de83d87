"""POSTing to an operator's webhook: credentials as Basic auth, secrets never in an error, no redirect followed."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator

import pytest

from tests.servers import QuietHandler, http_server
from zombie_pipeline.observability import alerts
from zombie_pipeline.observability.webhooks import WebhookError, post_json
from zombie_pipeline.queue.embedded import free_port

SECRET_PATH = "/hooks/s3cr3t"


@contextlib.contextmanager
def receiver(status: int = 200, headers: dict[str, str] | None = None) -> Iterator[tuple[int, list[dict]]]:
    """A real HTTP server on 127.0.0.1 answering ``status``; the port, and the requests it received."""
    received: list[dict] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(
                {
                    "path": self.path,
                    "authorization": self.headers["Authorization"],
                    "host": self.headers["Host"],
                    "body": body,
                }
            )
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()

    with http_server(Handler) as port:
        yield port, received


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_as_part_of_the_host():
    with receiver() as (port, received):
        status = post_json(f"http://us%40er:to%3Aken@127.0.0.1:{port}{SECRET_PATH}?x=1", {"a": 1}, 5)

    assert status == 200
    [request] = received
    assert request["authorization"] == "Basic " + base64.b64encode(b"us@er:to:ken").decode()
    assert (request["path"], request["host"], request["body"]) == (f"{SECRET_PATH}?x=1", f"127.0.0.1:{port}", {"a": 1})


def test_a_url_without_credentials_sends_no_authorization():
    with receiver() as (port, received):
        post_json(f"http://127.0.0.1:{port}/hook", {}, 5)

    assert received[0]["authorization"] is None


@pytest.mark.parametrize("status", [500, 404, 302])
def test_an_answer_other_than_2xx_is_an_error_naming_only_scheme_host_and_port(status):
    with (
        receiver(status, headers={"Location": "http://127.0.0.1:1/elsewhere"}) as (port, received),
        pytest.raises(WebhookError) as raised,
    ):
        post_json(f"http://user:t0ken@127.0.0.1:{port}{SECRET_PATH}", {}, 5)

    assert str(raised.value) == f"POST http://127.0.0.1:{port}/… answered {status}"
    assert len(received) == 1  # a redirect is not followed: the body would go where nobody configured


def test_an_unreachable_webhook_fails_in_time_without_its_secrets():
    port = free_port()
    with pytest.raises(WebhookError) as raised:
        post_json(f"http://user:t0ken@127.0.0.1:{port}{SECRET_PATH}", {}, 2)

    message = str(raised.value)
    assert message.startswith(f"POST http://127.0.0.1:{port}/… failed: ConnectionError")
    assert "t0ken" not in message and "s3cr3t" not in message and "user" not in message


def test_a_url_that_is_not_http_is_refused_before_anything_is_sent():
    for url in ("ftp://user:t0ken@host/x", "not a url", "//host/x"):
        with pytest.raises(WebhookError, match="must start with http:// or https://") as raised:
            post_json(url, {}, 1)
        assert "t0ken" not in str(raised.value)


def test_the_failure_webhook_delivers_to_a_url_with_credentials():
    with receiver(204) as (port, received):
        outcome = alerts.post_alert(f"http://ops:t0ken@127.0.0.1:{port}{SECRET_PATH}", {"text": "run failed"}, 5)

    assert outcome == "sent (HTTP 204)"
    assert received[0]["authorization"] == "Basic " + base64.b64encode(b"ops:t0ken").decode()
