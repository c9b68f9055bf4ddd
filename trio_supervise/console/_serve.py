"""Serving the console with hypercorn's Trio worker: the port is bound first (:func:`bind_http`),
so that an address in use is one clear error, then :func:`serve_http` serves until the service's
:class:`~trio_supervise.Shutdown` begins (a ``nursery.start``-style service reporting its port).
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._lifecycle import Shutdown
from ._app import OperationsApp
from ._auth import is_loopback
from ._web import Receive, Scope, Send

__all__ = ["HttpBindError", "bind_http", "serve_http"]

logger = logging.getLogger("trio_supervise.http")


class HttpBindError(OSError):
    """The operations server cannot listen where it was told (the address in use, say)."""


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_http(host: str = "127.0.0.1", port: int = 8080) -> Any:
    """Bind and listen on *host*:*port* now, for :func:`serve_http`'s *sockets*.

    Returns hypercorn's ``Sockets``; raises :class:`HttpBindError` as one line,
    ``cannot bind 127.0.0.1:8080: address already in use``. Close the sockets (or hand them to
    :func:`serve_http`, which closes them) when done.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port!r}")
    from hypercorn.config import Sockets

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise HttpBindError(f"cannot bind {_address(host, port)}: {_reason(error)}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except (OSError, UnicodeError) as error:  # UnicodeError: a host name IDNA cannot encode
        sock.close()
        raise HttpBindError(f"cannot bind {_address(host, port)}: {_reason(error)}") from None
    return Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


_BACKLOG = 100
"""Connections the kernel queues before the server accepts them (hypercorn's default)."""


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return "address already in use"
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return text[:1].lower() + text[1:]


def _close(sockets: Any) -> None:
    for sock in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
        sock.close()


def _config(host: str, port: int, graceful_timeout: float = 3.0) -> Any:
    from hypercorn.config import Config

    config = Config()
    config.bind = [_address(host, port)]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = graceful_timeout
    config.h11_max_incomplete_size = 16 * 1024
    config.h2_max_header_list_size = 16 * 1024
    config.max_app_queue_size = 10
    config.keep_alive_timeout = 5
    config.include_server_header = False
    config.wsgi_max_body_size = 0
    return config


def _port_of(bind: str) -> int:
    return int(bind.rpartition(":")[2])


async def serve_http(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown: Shutdown,
    graceful_timeout: float = 3.0,
    sockets: Any = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* with hypercorn's Trio worker until *shutdown* begins.

    Reports the bound port through *task_status* (useful with ``port=0``). Open requests get
    *graceful_timeout* seconds once shutdown begins. *sockets* from :func:`bind_http` are used
    (and closed) instead of binding *host*:*port* here; either way an address that cannot be
    bound raises :class:`HttpBindError` before anything is served. An :class:`OperationsApp`
    without credentials is served on loopback only (``ValueError`` otherwise).
    """
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    if isinstance(app, OperationsApp) and not app.authenticates and not is_loopback(host):
        raise ValueError(
            f"host {host!r} is not a loopback address, so the console needs credentials: "
            "give the OperationsApp a token or a password_hash"
        )
    if sockets is None:
        sockets = bind_http(host, port)
    config = _config(host, port, graceful_timeout)
    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(
                    worker_serve,
                    wrap_app(app, config.wsgi_max_body_size, "asgi"),  # type: ignore[arg-type]
                    config,
                    sockets=sockets,
                    shutdown_trigger=shutdown.wait,
                )
            )
            bound = _port_of(binds[0])
            logger.info("operations HTTP on %s", binds[0])
            task_status.started(bound)
    finally:
        _close(sockets)
