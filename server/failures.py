"""How a failure while serving a request becomes its HTTP error, and the injected fault.

:func:`as_api_error` maps any exception a request raised to the :class:`APIError` it is
answered with: the runtime's refusals (prompt too long, overloaded, workflow ended), misuse
(400), engine failures and unexpected errors (500, logged). :class:`InjectedFault` is the
failure a fault test asks for with the ``X-PBKV-Inject-Fault: until`` header on a server
with ``fault_injection``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from pbkv.server.asgi import Scope, request_headers
from pbkv.server.errors import APIError

log = logging.getLogger(__name__)

FAULT_HEADER = "x-pbkv-inject-fault"


class InjectedFault(RuntimeError):
    """Raised by the stop callback of a request with ``X-PBKV-Inject-Fault: until`` on a
    server with ``fault_injection`` (fault tests: one call's own failure)."""


def failing_until(token: int) -> bool:
    """The stop callback of a request with a fault injected: raises at its first token.

    Raises:
        InjectedFault: always.
    """
    raise InjectedFault("a fault injected into this request's stop callback")


def fault_header(scope: Scope) -> str | None:
    """Return the fault a request asks to have injected (``until``), if any.

    Raises:
        APIError: 400 naming the header for a fault other than ``until``.
    """
    value = request_headers(scope).get(FAULT_HEADER)
    if value is None:
        return None
    if value.strip().lower() != "until":
        raise APIError(
            400,
            f"header {FAULT_HEADER}: the fault 'until' is known, got {value!r}",
            param=FAULT_HEADER,
        )
    return "until"


def in_chain(exc: BaseException, found: Callable[[BaseException], bool]) -> bool:
    """Whether ``exc`` or an error in its cause (or context) chain is ``found``."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if found(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def never_fits(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error in its cause chain) says the request can never fit
    the GPU KV tier: :class:`RequestTooLarge`, or the live runtime's :class:`CallFailed`
    that carries it as text (the only engine error that is not retryable)."""
    from pbkv.engines.base import RequestTooLarge
    from pbkv.live.session import CallFailed

    return in_chain(
        exc,
        lambda e: isinstance(e, RequestTooLarge) or (isinstance(e, CallFailed) and not e.retryable),
    )


def draining_error(retry_after_s: int) -> APIError:
    """Return the 503 ``shutting_down`` of a request met by a draining server."""
    return APIError(
        503,
        "the server is shutting down",
        type="server_error",
        code="shutting_down",
        retry_after_s=retry_after_s,
    )


def as_api_error(exc: Exception, retry_after_s: int) -> APIError:
    """Return the error ``exc`` is answered with.

    Args:
        exc: what serving the request raised.
        retry_after_s: the ``Retry-After`` of a 429 (raised to the runtime's own hint).
    """
    from pbkv.engines.base import EngineError
    from pbkv.live import Overloaded, PromptTooLong, WorkflowEnded

    retry = retry_after_s
    match exc:
        case APIError():
            return exc
        case _ if in_chain(exc, lambda e: isinstance(e, InjectedFault)):
            return APIError(500, str(exc), type="server_error", code="injected_fault")
        case _ if never_fits(exc):  # normally named by the app's _serve; this is the fallback
            return APIError(400, str(exc), code="context_length_exceeded")
        case PromptTooLong():
            return APIError(400, str(exc), param="messages", code="context_length_exceeded")
        case Overloaded():
            retry = max(retry, math.ceil(exc.retry_after_s))
            return APIError(
                429, str(exc), type="rate_limit_error", code="overloaded", retry_after_s=retry
            )
        case WorkflowEnded():
            return APIError(409, str(exc), code="workflow_ended")
        case ValueError() | TypeError():
            return APIError(400, str(exc))
        case EngineError():
            log.warning("engine failed a request: %s", exc)
            return APIError(500, f"the engine failed the request: {exc}", type="server_error")
        case _:
            log.exception("unexpected error serving a request", exc_info=exc)
            return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")
