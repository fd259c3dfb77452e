"""Fetch URLs for a runner: :data:`fetch_url`, or a :class:`Fetcher` with options.

    import batch, batch.web, store
    with store.open("jobs.sqlite3") as db, batch.Runner(db, batch.web.fetch_url) as runner:
        job_id = runner.submit(batch.Caller("me"), ["https://example.org/"])

A fetch reads the whole body (``http``, ``https`` or ``file`` URL), hashing it
as it arrives, and returns ``{"url", "final_url", "status", "content_type",
"bytes", "sha256", "seconds"}``: ``final_url`` after redirects, ``status``
the HTTP status (None for a file), ``bytes`` the body's length, ``seconds``
the fetch's duration; ``"file"`` too, the name the body was saved under, with
``save_dir``.

What each failure becomes, decided by whether asking again could help:

- 429 and 503: the upstream is busy: ``RetryLater``, ``after`` taken from
  ``Retry-After`` (delta-seconds or an HTTP-date).
- Any other 4xx or 5xx: ``TargetError`` with a hint (404: "check the URL";
  401/403: "needs credentials"; 5xx: "server error; try again later"): a
  server error may clear, but not within one run, and tying up a job's turn
  on it would delay the rest.
- A timeout, a refused, reset or unreachable connection, a body cut short:
  ``RetryLater``: the host may be overloaded or restarting, and the runner's
  ``retry_for`` bounds how long it is given.
- A host name that does not resolve, a certificate that does not verify, a
  malformed URL or answer, a missing or unreadable file: ``TargetError``:
  the same request would fail the same way.
- The runner closing: a fetch not yet started raises ``RetryLater`` (the
  target stays pending, for the next runner); a download still arriving is
  abandoned as a ``TargetError`` ("fetch it again").

Saving (``save_dir``): each body is written to a temporary file in that
directory and renamed into place (``os.replace``) once complete, so a file
under its final name is always whole. The name, from :func:`safe_name`, is a
single path component: no URL can make a fetch write outside the directory,
and a symbolic link already in it under that name is replaced, never followed.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import errno
import hashlib
import http.client
import math
import os
import re
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from store import __version__
from store.jobs.pauses import origin

from .context import Context
from .errors import BatchError, RetryLater, TargetError
from .model import Target

__all__ = [
    "SCHEMES",
    "Fetcher",
    "crawl_delay",
    "error_for_status",
    "fetch_url",
    "host_of",
    "retry_after",
    "robots_delay",
    "safe_name",
]

#: The URL schemes a fetch accepts.
SCHEMES = ("http", "https", "file")

#: Bytes read (and hashed, and written) at a time.
CHUNK = 1 << 16

#: Seconds a fetch waits to connect, or for more of an answer, by default.
TIMEOUT = 30.0

#: The most a ``Retry-After`` is taken to ask for: anything longer is as good
#: as "not within this run", and a runner fails such a target at once.
LONGEST_RETRY_AFTER = 365 * 86400.0

#: How much of a URL's host and path a saved file's name keeps, in characters.
NAME_STEM = 80

#: What a fetch says it is.
USER_AGENT = f"batch-store/{__version__} (python urllib)"

#: Statuses that mean "busy": ask again later.
BUSY_STATUSES = frozenset({429, 503})

#: Errors of a connection worth trying again: the host may be back soon.
TRANSIENT_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN})


class Fetcher:
    """A fetch function for :class:`batch.Runner`, with its options.

    - ``timeout``: seconds any one network operation (connect, each read) may
      take before the fetch counts as busy.
    - ``save_dir``: an existing directory to save each body in (see the
      module's docstring); None saves nothing.
    - ``proxies``: as :class:`urllib.request.ProxyHandler` takes them; None
      uses the environment's (``https_proxy``, ``no_proxy``...), ``{}`` none.

    Safe to call from several worker threads at once.
    """

    def __init__(
        self,
        *,
        timeout: float = TIMEOUT,
        save_dir: str | os.PathLike[str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.timeout = float(timeout)
        self.save_dir = None
        if save_dir is not None:
            if not os.path.isdir(save_dir):
                raise NotADirectoryError(f"save_dir {os.fspath(save_dir)!r} is not a directory")
            self.save_dir = os.path.realpath(save_dir)
        handlers = [] if proxies is None else [urllib.request.ProxyHandler(dict(proxies))]
        self._opener = urllib.request.build_opener(*handlers)

    def __call__(self, ctx: Context, caller: object, target: Target) -> dict[str, Any]:
        """Fetch ``target.ref``; return its result or raise as the module says."""
        if ctx.cancelled():
            raise RetryLater("not started: the runner is closing")
        url = target.ref
        started = time.monotonic()
        request = urllib.request.Request(
            url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        )
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return self._read(ctx, url, response, started)
        except urllib.error.HTTPError as e:
            e.close()
            raise error_for_status(e.code, e.reason, e.headers.get("Retry-After")) from e
        except urllib.error.URLError as e:
            raise _connection_error(e.reason) from e
        except (OSError, http.client.HTTPException) as e:
            raise _connection_error(e) from e
        except ValueError as e:  # urllib's word for a URL it cannot use
            raise TargetError(f"bad URL: {e}", hint="check the URL") from e

    def _read(self, ctx: Context, url: str, response: Any, started: float) -> dict[str, Any]:
        """Read the body of a successful answer, saving it if asked."""
        digest = hashlib.sha256()
        size = 0
        saving: contextlib.AbstractContextManager[Callable[[bytes], object]]
        if self.save_dir is None:
            name, saving = None, contextlib.nullcontext(_discard)
        else:
            name = safe_name(url)
            saving = _saving(self.save_dir, name)
        with saving as write:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                write(chunk)
                if ctx.cancelled() and _still_arriving(response):
                    raise TargetError(
                        "download abandoned: the runner closed", hint="fetch it again"
                    )
            _check_length(response, size)
        result: dict[str, Any] = {
            "url": url,
            "final_url": response.geturl(),
            "status": getattr(response, "status", None),
            "content_type": response.headers.get("Content-Type"),
            "bytes": size,
            "sha256": digest.hexdigest(),
            "seconds": round(time.monotonic() - started, 3),
        }
        if name is not None:
            result["file"] = name
        return result


#: Fetch a URL with the default options (no saving).
fetch_url = Fetcher()


def error_for_status(status: int, reason: str, retry_after_value: str | None) -> BatchError:
    """The error a non-2xx HTTP answer means: ``RetryLater`` (with ``after``
    from ``Retry-After``) for a busy one, else ``TargetError`` with a hint."""
    what = f"HTTP {status} {reason}".rstrip()
    if status in BUSY_STATUSES:
        return RetryLater(what, after=retry_after(retry_after_value))
    if status in (401, 403, 407):
        hint = "needs credentials"
    elif status in (404, 410):
        hint = "check the URL"
    elif status >= 500:
        hint = "server error; try again later"
    elif status >= 400:
        hint = "the server refused the request; check the URL"
    else:
        hint = "an answer the client cannot follow (a redirect loop?); check the URL"
    return TargetError(what, hint=hint)


def host_of(target: Target) -> str | None:
    """The upstream a URL target calls, for ``Config.upstream``:
    ``scheme://host:port``, lower case, the scheme's port filled in (so
    ``https://Example.org/a`` and ``https://example.org:443/b`` share one).
    None for a ``file`` URL or what is not a URL with a host: no pacing. A
    pause may name it by its host, or ``host:port`` (``store.jobs.pauses``)."""
    return origin(target.ref)


def crawl_delay(upstream: str, timeout: float = TIMEOUT) -> float | None:
    """The ``Crawl-delay`` the ``robots.txt`` of ``upstream`` (as
    :func:`host_of` names it) asks of this agent (or of every agent), in
    seconds; None if it asks none, or cannot be read."""
    request = urllib.request.Request(f"{upstream}/robots.txt", headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return robots_delay(text, USER_AGENT.split("/", 1)[0])


def robots_delay(text: str, agent: str) -> float | None:
    """The ``Crawl-delay`` a ``robots.txt`` asks of ``agent``: the group
    naming it (by a case-blind prefix), else the ``*`` group; seconds,
    fractions allowed (the standard library's parser takes whole seconds
    only); None if none."""
    delays: dict[str, float] = {}
    agents: list[str] = []
    in_rules = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "user-agent":
            if in_rules:
                agents, in_rules = [], False
            agents.append(value.lower())
        elif name in ("crawl-delay", "allow", "disallow"):
            in_rules = True
            if name == "crawl-delay":
                with contextlib.suppress(ValueError):
                    if math.isfinite(delay := float(value)) and delay > 0:
                        for who in agents:
                            delays.setdefault(who, delay)
    mine = agent.lower()
    named = [d for who, d in delays.items() if who != "*" and mine.startswith(who)]
    return named[0] if named else delays.get("*")


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header value asks to wait: delta-seconds,
    or an HTTP-date (a past date: 0). None for a missing or malformed value.
    At most :data:`LONGEST_RETRY_AFTER`."""
    if value is None:
        return None
    value = value.strip()
    if re.fullmatch(r"[0-9]+", value):
        # Sixteen digits are past the cap already; int() of a few thousand would raise.
        return min(float(value[:16]), LONGEST_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": a time in UTC, says RFC 5322
        when = when.replace(tzinfo=datetime.UTC)
    wait = when.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, wait), LONGEST_RETRY_AFTER)


def safe_name(url: str) -> str:
    """A file name for the body of ``url``: its host and path with every
    character but ASCII letters, digits, ``.``, ``_`` and ``-`` turned into
    ``_``, cut to :data:`NAME_STEM` characters, then a hash of the whole URL
    and the path's extension. Always one path component: never empty, never
    ``.`` or ``..``, never starting with a dot, at most 110 ASCII characters.
    Different URLs get different names (barring a 48-bit hash collision)."""
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.unquote(parts.path)
    found = re.search(r"\.[A-Za-z0-9]{1,8}$", path)
    ext = found.group() if found else ""
    where = f"{parts.hostname or parts.scheme}{path.removesuffix(ext)}"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", where)[:NAME_STEM].strip("._-") or "url"
    tag = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{stem}-{tag}{ext}"


@contextlib.contextmanager
def _saving(directory: str, name: str) -> Iterator[Callable[[bytes], object]]:
    """Yield a function that writes to a new temporary file in ``directory``;
    the file becomes ``name`` if the block ends normally and is removed
    otherwise. A failure of the file itself (a full disk) is a ``TargetError``;
    what the block raises passes through unchanged."""
    part = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.part")
    with _cannot_save(name):
        # O_EXCL: a fresh file, never one (or a link) already there.
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    out = os.fdopen(fd, "wb")

    def write(chunk: bytes) -> None:
        with _cannot_save(name):
            out.write(chunk)

    try:
        yield write
        with _cannot_save(name):
            out.close()
            os.replace(part, os.path.join(directory, name))
    finally:
        with contextlib.suppress(OSError):
            out.close()
            os.unlink(part)


@contextlib.contextmanager
def _cannot_save(name: str) -> Iterator[None]:
    """Turn an ``OSError`` of the block into the target's failure to be saved."""
    try:
        yield
    except OSError as e:
        raise TargetError(
            f"cannot save {name}: {e.strerror or e}",
            hint="check the save directory: its space and permissions",
        ) from e


def _discard(chunk: bytes) -> None:
    """Where a body goes when it is not saved."""


def _still_arriving(response: Any) -> bool:
    """Whether more of an HTTP body may follow (a file is read at disk speed)."""
    return isinstance(response, http.client.HTTPResponse) and not response.isclosed()


def _check_length(response: Any, size: int) -> None:
    """``RetryLater`` if the connection closed before ``Content-Length`` bytes
    came (``HTTPResponse.read`` says nothing then)."""
    declared = response.headers.get("Content-Length", "")
    if (
        isinstance(response, http.client.HTTPResponse)
        and re.fullmatch(r"[0-9]{1,18}", declared)
        and size < int(declared)
    ):
        raise RetryLater(f"connection closed after {size} of {declared} bytes")


def _connection_error(reason: object) -> BatchError:
    """The error a failure to connect, or to read, means (see the module's docstring)."""
    if isinstance(reason, socket.gaierror):
        return TargetError(f"cannot resolve host: {reason.strerror}", hint="check the host name")
    if isinstance(reason, ssl.SSLCertVerificationError):
        return TargetError(
            f"certificate not trusted: {reason.verify_message}",
            hint="the server's certificate does not verify",
        )
    if isinstance(reason, TimeoutError | ConnectionError | http.client.IncompleteRead):
        return RetryLater(_describe(reason))
    if isinstance(reason, OSError) and reason.errno in TRANSIENT_ERRNOS:
        return RetryLater(_describe(reason))
    if isinstance(reason, FileNotFoundError | NotADirectoryError):
        return TargetError("no such file", hint="check the path")
    if isinstance(reason, PermissionError):
        return TargetError("permission denied", hint="needs read access")
    if isinstance(reason, IsADirectoryError):
        return TargetError("a directory, not a file", hint="check the path")
    if isinstance(reason, ssl.SSLError):
        return TargetError(f"TLS failed: {_describe(reason)}", hint="check the URL's scheme")
    if isinstance(reason, http.client.HTTPException):
        return TargetError(f"not an HTTP answer: {_describe(reason)}", hint="check the URL")
    return TargetError(_describe(reason), hint="check the URL")


def _describe(reason: object) -> str:
    """A failure in words: an OSError's ``strerror``, else its text, else its kind."""
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return str(reason.strerror).lower()
    return str(reason) or type(reason).__name__
