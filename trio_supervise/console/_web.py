"""Requests and responses as the console's handlers see them: the ASGI types, a parsed request
(headers, query, cookies, and its form read within a bound), a response, who is asking, and the
small rules of paths and cookies.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import attrs

from ._views import unquote_part

__all__ = [
    "FLASH_COOKIE",
    "SESSION_COOKIE",
    "Handler",
    "Receive",
    "Request",
    "Response",
    "Scope",
    "Send",
    "Visit",
    "cookie",
    "local_path",
    "page_query",
    "segments",
    "text",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_BODY = 256 * 1024
"""The largest form an action accepts (a bulk retry of a page of long ids fits many times)."""
SESSION_COOKIE = "ts_csrf"
FLASH_COOKIE = "ts_flash"
TEXT = (b"content-type", b"text/plain; charset=utf-8")


@attrs.frozen
class Response:
    status: int
    headers: Headers
    body: bytes


def text(status: int, words: str, *headers: tuple[bytes, bytes]) -> Response:
    """A plain-text response of *words*."""
    plain = [TEXT, (b"x-content-type-options", b"nosniff")]
    return Response(status, [*plain, *headers], (words + "\n").encode("utf-8", "backslashreplace"))


@attrs.frozen
class Request:
    scope: Scope
    receive: Receive
    method: str
    headers: Mapping[str, str]
    query: Mapping[str, list[str]]
    cookies: Mapping[str, str]

    @classmethod
    def of(cls, scope: Scope, receive: Receive) -> Request:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        cookies: dict[str, str] = {}
        for part in headers.get("cookie", "").split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name not in cookies:
                cookies[name] = value
        query = urllib.parse.parse_qs(
            scope.get("query_string", b"").decode("latin-1"),
            keep_blank_values=True,
            max_num_fields=100,
        )
        return cls(scope, receive, scope.get("method", "GET"), headers, query, cookies)

    @property
    def client(self) -> str:
        client = self.scope.get("client")
        return "?" if not client else str(client[0])

    @property
    def secure(self) -> bool:
        return self.scope.get("scheme") == "https"

    def first(self, name: str) -> str:
        return (self.query.get(name) or [""])[0]

    async def form(self) -> dict[str, list[str]]:
        """The posted form, read up to :data:`MAX_BODY` bytes (ValueError past it, or when it is
        not ``application/x-www-form-urlencoded``)."""
        kind = self.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise ValueError("an action is a form (application/x-www-form-urlencoded)")
        body = b""
        while True:
            message = await self.receive()
            if message.get("type") != "http.request":
                break
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                raise ValueError(f"the form is larger than {MAX_BODY} bytes")
            if not message.get("more_body", False):
                break
        return urllib.parse.parse_qs(
            body.decode("utf-8", "surrogateescape"), keep_blank_values=True, max_num_fields=2000
        )


@attrs.frozen
class Visit:
    """What a console request carries besides itself: who asked, and its CSRF session."""

    who: str
    session: str
    new_session: bool
    csrf: str


Handler = Callable[[Request, Visit], Awaitable[Response]]


def segments(scope: Scope) -> list[str] | None:
    """The request path's segments, each percent-decoded on its own (so an item id holding
    ``/`` is one segment); None when one is not UTF-8."""
    raw = scope.get("raw_path")
    try:
        if isinstance(raw, bytes) and raw:
            path = raw.partition(b"?")[0]
            return [unquote_part(part) for part in path.split(b"/")[1:]] if path != b"/" else []
        path_text = str(scope.get("path", ""))
        return path_text.split("/")[1:] if path_text != "/" else []
    except UnicodeDecodeError:
        return None


def local_path(path: str, default: str = "/") -> str:
    """*path* if it is a path on this server (``/...``, not ``//host``), else *default*."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path or len(path) > 4096:
        return default
    if not path.isascii():
        return default
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        return default
    return path


def cookie(name: str, value: str, *, secure: bool, max_age: int | None = None) -> bytes:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts).encode()


def page_query(**values: str | list[str] | None) -> str:
    pairs = [
        (name, each)
        for name, value in values.items()
        if value
        for each in ([value] if isinstance(value, str) else value)
    ]
    return urllib.parse.urlencode(pairs)
