"""Retries with exponential backoff for transient object-store errors.

Object stores fail transiently all the time at scale (throttling, resets, 5xx). Those are retried
with capped exponential backoff and full jitter; everything else (missing object, permission,
precondition failed, bad request) is permanent and raised at once.
"""

from __future__ import annotations

import dataclasses
import errno
import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_TRANSIENT_ERRNOS = {
    errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED,
    errno.ECONNABORTED, errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EBUSY,
}
# Exception class names from botocore/aiohttp/urllib3 that mean "try again"; matched by name so
# that core does not import those libraries.
_TRANSIENT_CLASS_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ResponseStreamingError", "IncompleteReadError", "ServerDisconnectedError", "ClientOSError",
    "ClientPayloadError", "ProtocolError", "ServiceUnavailable", "ThrottlingException",
}
_TRANSIENT_MESSAGE_FRAGMENTS = (
    "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "503", "500 ", "Throttl",
    "Please reduce your request rate",
)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is worth retrying (timeouts, resets, throttling, 5xx)."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError, ValueError, TypeError, KeyError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSIENT_CLASS_NAMES:
            return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    text = str(exc)
    if isinstance(exc, OSError) and any(fragment in text for fragment in _TRANSIENT_MESSAGE_FRAGMENTS):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure."""

    attempts: int = 6
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0

    def call(self, operation: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep,
             classify: Callable[[BaseException], bool] = is_transient) -> T:
        """Run ``operation``, retrying transient errors; re-raise the last error when out of attempts."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except Exception as exc:
                if attempt == self.attempts or not classify(exc):
                    raise
                cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
                sleep(random.uniform(0, cap))
        raise AssertionError("unreachable")
