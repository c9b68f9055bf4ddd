"""Who may use the operations console, and proof that a form was the console's own.

- **Credentials.** Off loopback the console asks for HTTP Basic credentials (or a bearer token):
  the password is checked against ``http.password_hash`` (``scheme$params$salt$hash``, made by
  :func:`hash_password`, scrypt or PBKDF2 from the standard library), or the token against
  ``http.token``. A hash is slow on purpose, so it runs in a worker thread (the event loop keeps
  renewing leases meanwhile), one at a time, and a password once found right is remembered (as
  an HMAC under a key of this process) so the next request of that browser costs nothing.
- **CSRF.** Every form carries a token bound to a per-browser session id held in a
  ``SameSite=Strict; HttpOnly`` cookie: the token is an HMAC of the session id under the console's
  key, compared in constant time, so a page of another site can neither read nor forge it.
- **Flash messages** ride in a cookie signed the same way, so what the page says after an action
  is always the console's own words.

The key is derived from the configured secret (so replicas behind one address accept each
other's forms) or drawn at random per process when there is none (loopback).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Mapping

import attrs
import trio

__all__ = [
    "CREDENTIALS_REALM",
    "ConsoleAuth",
    "ConsoleKeys",
    "PasswordHash",
    "check_password_hash",
    "check_token",
    "hash_password",
    "is_loopback",
]

CREDENTIALS_REALM = "trio_supervise console"
"""The realm a browser shows when it asks for the console's credentials."""

MIN_TOKEN_LENGTH = 16
"""The shortest console token accepted (a random token of 16 characters or more)."""

_SCRYPT = "scrypt"
_PBKDF2 = "pbkdf2_sha256"
_SCRYPT_DEFAULTS = {"n": 2**15, "r": 8, "p": 1}
_PBKDF2_DEFAULT_ITERATIONS = 600_000
_MAX_MEMORY = 256 * 1024 * 1024
"""The most memory one scrypt check may use (n * r * 128 bytes), and so the largest n accepted."""
_REMEMBERED = 1000
"""How many right (user, password) pairs a console remembers before forgetting them all."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@attrs.frozen
class PasswordHash:
    """A parsed ``scheme$params$salt$hash`` (see :func:`check_password_hash`)."""

    scheme: str
    params: Mapping[str, int]
    salt: bytes
    digest: bytes

    def derive(self, password: str) -> bytes:
        """The digest *password* gives under this hash's scheme, params and salt (slow)."""
        secret = password.encode("utf-8", "surrogatepass")
        if self.scheme == _SCRYPT:
            n, r, p = self.params["n"], self.params["r"], self.params["p"]
            return hashlib.scrypt(
                secret, salt=self.salt, n=n, r=r, p=p, maxmem=_MAX_MEMORY + 1024 * 1024,
                dklen=len(self.digest),
            )  # fmt: skip
        return hashlib.pbkdf2_hmac(
            "sha256", secret, self.salt, self.params["i"], dklen=len(self.digest)
        )

    def verify(self, password: str) -> bool:
        """Whether *password* is the one hashed (compared in constant time)."""
        return hmac.compare_digest(self.derive(password), self.digest)


def hash_password(password: str, *, scheme: str = _SCRYPT, salt: bytes | None = None) -> str:
    """``http.password_hash`` for *password*: ``scrypt$n=32768,r=8,p=1$<salt>$<hash>`` (salt and
    hash in URL-safe base64), or with ``scheme="pbkdf2_sha256"``,
    ``pbkdf2_sha256$i=600000$<salt>$<hash>``."""
    given: object = password  # checked as whatever it was given
    if not isinstance(given, str) or not given:
        raise ValueError("password must be a non-empty string")
    if scheme == _SCRYPT:
        params: dict[str, int] = dict(_SCRYPT_DEFAULTS)
    elif scheme == _PBKDF2:
        params = {"i": _PBKDF2_DEFAULT_ITERATIONS}
    else:
        raise ValueError(f"scheme must be {_SCRYPT!r} or {_PBKDF2!r}, got {scheme!r}")
    salt = secrets.token_bytes(16) if salt is None else salt
    made = PasswordHash(scheme, params, salt, b"\0" * 32)
    digest = made.derive(password)
    text = ",".join(f"{name}={value}" for name, value in params.items())
    return f"{scheme}${text}${_b64(salt)}${_b64(digest)}"


_RULE = (
    "must be 'scrypt$n=N,r=R,p=P$SALT$HASH' or 'pbkdf2_sha256$i=ITERATIONS$SALT$HASH' "
    "(make one with `trio-supervise hash-password`)"
)


def check_password_hash(text: object) -> PasswordHash:
    """Parse *text* as a password hash; ``ValueError`` saying the expected form otherwise."""
    parts = text.split("$") if isinstance(text, str) else []
    if len(parts) != 4:
        raise ValueError(f"password_hash {_RULE}")
    scheme, param_text, salt_text, digest_text = parts
    wanted = {_SCRYPT: {"n", "r", "p"}, _PBKDF2: {"i"}}.get(scheme)
    if wanted is None:
        raise ValueError(f"password_hash: unknown scheme {scheme!r}; it {_RULE}")
    params: dict[str, int] = {}
    for pair in param_text.split(","):
        name, _, value = pair.partition("=")
        if not (value.isascii() and value.isdigit()) or name in params:
            raise ValueError(f"password_hash: bad parameter {pair!r}; it {_RULE}")
        params[name] = int(value)
    if set(params) != wanted:
        raise ValueError(f"password_hash: {scheme} takes {', '.join(sorted(wanted))}; it {_RULE}")
    try:
        salt, digest = _unb64(salt_text), _unb64(digest_text)
    except (binascii.Error, ValueError):
        raise ValueError(f"password_hash: salt and hash must be base64; it {_RULE}") from None
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("password_hash: the salt must be 8 bytes or more and the hash 16 or more")
    if scheme == _SCRYPT:
        n, r, p = params["n"], params["r"], params["p"]
        if n < 2 or n & (n - 1) or r < 1 or p < 1 or 128 * n * r > _MAX_MEMORY or p > 16:
            raise ValueError(
                "password_hash: scrypt needs n a power of 2, r >= 1, 1 <= p <= 16 and "
                f"128*n*r at most {_MAX_MEMORY // (1024 * 1024)} MiB"
            )
    elif not 1000 <= params["i"] <= 10_000_000:
        raise ValueError("password_hash: pbkdf2_sha256 needs i (iterations) from 1000 to 10000000")
    return PasswordHash(scheme, params, salt, digest)


def check_token(token: object) -> str:
    """Refuse a console token shorter than 16 characters or holding anything but printable
    ASCII without spaces (it travels in a header)."""
    if (
        not isinstance(token, str)
        or len(token) < MIN_TOKEN_LENGTH
        or not token.isascii()
        or not token.isprintable()
        or " " in token
    ):
        raise ValueError(
            f"token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters without "
            "spaces (a random one: python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether *host* names this machine only (127.0.0.0/8, ::1 or ``localhost``)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.define(eq=False)
class ConsoleKeys:
    """The console's HMAC key: CSRF tokens and signed flash messages (see the module doc)."""

    key: bytes = attrs.field(factory=lambda: os.urandom(32))

    @classmethod
    def from_secret(cls, secret: str | None) -> ConsoleKeys:
        """A key derived from *secret* (shared by every replica configured alike), else random."""
        if not secret:
            return cls()
        return cls(hmac.digest(secret.encode(), b"trio_supervise console key", "sha256"))

    def _mac(self, purpose: bytes, value: str) -> str:
        return _b64(hmac.digest(self.key, purpose + b"\0" + value.encode(), "sha256"))

    @staticmethod
    def new_session() -> str:
        """A fresh random session id for the CSRF cookie."""
        return secrets.token_urlsafe(32)

    def csrf_token(self, session: str) -> str:
        """The token every form of *session*'s pages carries."""
        return self._mac(b"csrf", session)

    def csrf_ok(self, session: str | None, token: str | None) -> bool:
        """Whether *token* is *session*'s (constant time); False if either is missing."""
        if not session or not token:
            return False
        return hmac.compare_digest(self.csrf_token(session), token)

    def sign(self, ok: bool, text: str) -> str:
        """A flash message as a cookie value only this console could have written."""
        payload = _b64(json.dumps([ok, text]).encode())
        return f"{payload}.{self._mac(b'flash', payload)}"

    def unsign(self, value: str | None) -> tuple[bool, str] | None:
        """The flash message of a cookie value from :meth:`sign`, or None if it is not one."""
        if not value or "." not in value:
            return None
        payload, _, mac = value.partition(".")
        if not hmac.compare_digest(self._mac(b"flash", payload), mac):
            return None
        try:
            ok, text = json.loads(_unb64(payload))
        except (ValueError, TypeError, binascii.Error):
            return None
        return bool(ok), str(text)


@attrs.define(eq=False)
class ConsoleAuth:
    """Checks a request's ``Authorization`` header against a token and/or a password hash.

    ``Authorization: Bearer <token>``, or HTTP Basic with any user name and the token or the
    password as the password. :meth:`who` returns who asked (the Basic user name, or
    ``"token"``), or None when the credentials are missing or wrong.
    """

    token: str | None = None
    password_hash: PasswordHash | None = None
    _remembered: set[str] = attrs.field(init=False, factory=set)
    _limiter: trio.CapacityLimiter = attrs.field(
        init=False, factory=lambda: trio.CapacityLimiter(1)
    )
    _key: bytes = attrs.field(init=False, factory=lambda: os.urandom(32))

    def __attrs_post_init__(self) -> None:
        if self.token is None and self.password_hash is None:
            raise ValueError("ConsoleAuth needs a token or a password_hash")

    async def who(self, authorization: str | None) -> str | None:
        """Who the credentials in *authorization* (the header's value) are, if right."""
        if not authorization:
            return None
        scheme, _, rest = authorization.strip().partition(" ")
        rest = rest.strip()
        if scheme.lower() == "bearer":
            return "token" if self._token_ok(rest) else None
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(rest, validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, ValueError):
            return None
        if not sep:
            return None
        if self._token_ok(password) or await self._password_ok(user, password):
            return user or "operator"
        return None

    def _token_ok(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.token.encode()
        )

    async def _password_ok(self, user: str, password: str) -> bool:
        stored = self.password_hash
        if stored is None:
            return False
        seen = _b64(
            hmac.digest(self._key, f"{user}\0{password}".encode(errors="replace"), "sha256")
        )
        if seen in self._remembered:
            await trio.lowlevel.checkpoint()
            return True
        right = await trio.to_thread.run_sync(stored.verify, password, limiter=self._limiter)
        if right:
            if len(self._remembered) >= _REMEMBERED:
                self._remembered.clear()
            self._remembered.add(seen)
        return right
