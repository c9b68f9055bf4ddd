"""The operations console over HTTP: ``/healthz``, ``/metrics``, and the pages and actions an
operator uses (the guide is docs/operations.md), served by hypercorn's Trio worker. The public
names are re-exported by ``trio_supervise``.
"""

from ._app import ErrorRecord as ErrorRecord
from ._app import OperationsApp as OperationsApp
from ._app import StatusSource as StatusSource
from ._auth import check_password_hash as check_password_hash
from ._auth import check_token as check_token
from ._auth import hash_password as hash_password
from ._auth import is_loopback as is_loopback
from ._metrics import SCRAPE_CACHE_SECONDS as SCRAPE_CACHE_SECONDS
from ._serve import HttpBindError as HttpBindError
from ._serve import bind_http as bind_http
from ._serve import serve_http as serve_http
from ._views import CONTENT_SECURITY_POLICY as CONTENT_SECURITY_POLICY
from ._views import quote_part as quote_part
from ._web import Receive as Receive
from ._web import Scope as Scope
from ._web import Send as Send
