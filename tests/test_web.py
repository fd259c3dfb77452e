"""``batch.web``: what each answer becomes, ``Retry-After``, safe file names,
and real fetches against a server on 127.0.0.1."""

from __future__ import annotations

import email.utils
import hashlib
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import batch
from batch import web
from bench.counting import serving

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
BODY = b"hello, batch\n" * 100
BIG = 3 * web.CHUNK  # a body read in several chunks


class Upstream(ThreadingHTTPServer):
    """A server answering by path:

    - ``/ok/...``: 200 and :data:`BODY`; ``/redirect``: 302 to ``/ok/moved``;
    - ``/status/CODE[?after=N]``: that status (with ``Retry-After: N``);
    - ``/short``: a ``Content-Length`` larger than the body sent;
    - ``/hold``: nothing until ``release`` is set, then 200;
    - ``/stall``: one chunk of a :data:`BIG` body, ``stalled`` set, then the
      rest once ``release`` is set.
    """

    daemon_threads = False  # server_close() joins every handler thread

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.paths: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_port}{path}"


class _Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        self.server.paths.append(parts.path)
        query = urllib.parse.parse_qs(parts.query)
        if parts.path.startswith("/status/"):
            headers = {"Retry-After": query["after"][0]} if "after" in query else {}
            self._answer(int(parts.path.rsplit("/", 1)[1]), b"no\n", headers)
        elif parts.path == "/redirect":
            self._answer(302, b"", {"Location": "/ok/moved"})
        elif parts.path == "/short":
            self._answer(200, b"only this", {"Content-Length": "100"})
        elif parts.path == "/hold":
            self.server.release.wait(WAIT)
            self._answer(200, BODY)
        elif parts.path == "/stall":
            self._answer(200, b"x" * web.CHUNK, {"Content-Length": str(BIG)})
            self.wfile.flush()
            self.server.stalled.set()
            self.server.release.wait(WAIT)
            self.wfile.write(b"x" * (BIG - web.CHUNK))
        else:
            self._answer(200, BODY)

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        headers = {
            "Content-Type": "text/plain",
            "Content-Length": str(len(body)),
            **(headers or {}),
        }
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serving(Upstream()) as server:
        try:
            yield server
        finally:
            server.release.set()


@pytest.fixture
def fetch() -> web.Fetcher:
    return web.Fetcher(timeout=WAIT, proxies={})


def get(fetcher: web.Fetcher, url: str, ctx: batch.Context | None = None) -> dict[str, Any]:
    return fetcher(ctx or batch.Context(), None, batch.Target(url))


# -- answers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (404, "check the URL"),
        (410, "check the URL"),
        (401, "needs credentials"),
        (403, "needs credentials"),
        (500, "server error; try again later"),
        (502, "server error; try again later"),
        (400, "the server refused the request; check the URL"),
        (304, "an answer the client cannot follow (a redirect loop?); check the URL"),
    ],
)
def test_an_error_status_is_final_with_a_hint(status: int, hint: str) -> None:
    err = web.error_for_status(status, "Reason", None)
    assert isinstance(err, batch.TargetError)
    assert (err.msg, err.hint) == (f"HTTP {status} Reason", hint)


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_status_asks_to_retry_after_what_the_server_said(status: int) -> None:
    err = web.error_for_status(status, "Busy", "3")
    assert isinstance(err, batch.RetryLater)
    assert (str(err), err.after) == (f"HTTP {status} Busy", 3.0)
    no_header = web.error_for_status(status, "Busy", None)
    assert isinstance(no_header, batch.RetryLater)
    assert no_header.after is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        (" 7 ", 7.0),
        ("120", 120.0),
        ("9" * 5000, web.LONGEST_RETRY_AFTER),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        ("\u0661", None),  # an Arabic-Indic digit: str.isdigit() says yes, HTTP says no
        (None, None),
    ],
)
def test_retry_after_in_seconds(value: str | None, seconds: float | None) -> None:
    assert web.retry_after(value) == seconds


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    assert web.retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert web.retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert web.retry_after("Sun, 06 Nov 1994 08:49:37 -0000", now=784111777.0) == 0.0


# -- fetches ----------------------------------------------------------------------


def test_a_document_is_fetched_hashed_and_described(upstream: Upstream, fetch: web.Fetcher) -> None:
    result = get(fetch, upstream.url("/ok/doc"))
    assert result.pop("seconds") >= 0
    assert result == {
        "url": upstream.url("/ok/doc"),
        "final_url": upstream.url("/ok/doc"),
        "status": 200,
        "content_type": "text/plain",
        "bytes": len(BODY),
        "sha256": hashlib.sha256(BODY).hexdigest(),
    }


def test_redirects_are_followed(upstream: Upstream, fetch: web.Fetcher) -> None:
    result = get(fetch, upstream.url("/redirect"))
    assert (result["url"], result["final_url"]) == (
        upstream.url("/redirect"),
        upstream.url("/ok/moved"),
    )


def test_a_busy_answer_is_retry_later(upstream: Upstream, fetch: web.Fetcher) -> None:
    with pytest.raises(batch.RetryLater, match="HTTP 429") as caught:
        get(fetch, upstream.url("/status/429?after=2"))
    assert caught.value.after == 2.0


def test_a_missing_document_is_a_target_error(upstream: Upstream, fetch: web.Fetcher) -> None:
    with pytest.raises(batch.TargetError, match="HTTP 404") as caught:
        get(fetch, upstream.url("/status/404"))
    assert caught.value.hint == "check the URL"


def test_a_body_cut_short_is_retry_later(upstream: Upstream, fetch: web.Fetcher) -> None:
    with pytest.raises(batch.RetryLater, match="connection closed after 9 of 100 bytes"):
        get(fetch, upstream.url("/short"))


def test_a_refused_connection_is_retry_later(fetch: web.Fetcher) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(batch.RetryLater, match="connection refused"):
        get(fetch, f"http://127.0.0.1:{port}/")


def test_a_timeout_is_retry_later(upstream: Upstream) -> None:
    with pytest.raises(batch.RetryLater, match="timed out"):
        get(web.Fetcher(timeout=0.2, proxies={}), upstream.url("/hold"))


def test_a_host_that_does_not_resolve_is_a_target_error(
    fetch: web.Fetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_such_host(*args: object, **kwargs: object) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(batch.TargetError, match="cannot resolve host") as caught:
        get(fetch, "http://nowhere.invalid/")
    assert caught.value.hint == "check the host name"


def test_file_urls(tmp_path: Path, fetch: web.Fetcher) -> None:
    (tmp_path / "doc.txt").write_bytes(BODY)
    result = get(fetch, (tmp_path / "doc.txt").as_uri())
    assert (result["status"], result["bytes"]) == (None, len(BODY))
    with pytest.raises(batch.TargetError, match="no such file") as caught:
        get(fetch, (tmp_path / "gone.txt").as_uri())
    assert caught.value.hint == "check the path"


def test_a_cancelled_context_starts_nothing(upstream: Upstream, fetch: web.Fetcher) -> None:
    ctx = batch.Context()
    ctx.cancel()
    with pytest.raises(batch.RetryLater, match="not started"):
        get(fetch, upstream.url("/ok/doc"), ctx)
    assert upstream.paths == []


def test_a_download_still_arriving_is_abandoned_once_cancelled(
    upstream: Upstream, fetch: web.Fetcher
) -> None:
    ctx = batch.Context()
    outcome: list[BaseException] = []

    def download() -> None:
        try:
            get(fetch, upstream.url("/stall"), ctx)
        except batch.TargetError as e:
            outcome.append(e)

    thread = threading.Thread(target=download)
    thread.start()
    assert upstream.stalled.wait(WAIT)
    ctx.cancel()
    upstream.release.set()
    thread.join(WAIT)
    assert [str(e) for e in outcome] == ["download abandoned: the runner closed"]


# -- saving -----------------------------------------------------------------------


def test_a_body_is_saved_whole_under_its_safe_name(upstream: Upstream, tmp_path: Path) -> None:
    result = get(web.Fetcher(save_dir=tmp_path, proxies={}), upstream.url("/ok/a/b.txt"))
    assert result["file"] == web.safe_name(upstream.url("/ok/a/b.txt"))
    assert os.listdir(tmp_path) == [result["file"]]
    assert (tmp_path / result["file"]).read_bytes() == BODY


def test_a_failed_download_leaves_no_file(upstream: Upstream, tmp_path: Path) -> None:
    with pytest.raises(batch.RetryLater):
        get(web.Fetcher(save_dir=tmp_path, proxies={}), upstream.url("/short"))
    assert os.listdir(tmp_path) == []


def test_a_network_failure_while_saving_is_the_network_s(
    upstream: Upstream, tmp_path: Path
) -> None:
    with pytest.raises(batch.RetryLater, match="timed out"):
        get(web.Fetcher(timeout=0.2, save_dir=tmp_path, proxies={}), upstream.url("/stall"))
    assert os.listdir(tmp_path) == []


def test_a_symlink_in_the_way_is_replaced_not_followed(upstream: Upstream, tmp_path: Path) -> None:
    saves, outside = tmp_path / "saves", tmp_path / "outside.txt"
    saves.mkdir()
    outside.write_text("keep me")
    url = upstream.url("/ok/doc")
    (saves / web.safe_name(url)).symlink_to(outside)
    get(web.Fetcher(save_dir=saves, proxies={}), url)
    assert outside.read_text() == "keep me"
    assert not (saves / web.safe_name(url)).is_symlink()
    assert (saves / web.safe_name(url)).read_bytes() == BODY


def test_save_dir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        web.Fetcher(save_dir=tmp_path / "file")


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://example.org/docs/index.html", "example.org_docs_index-{}.html"),
        ("http://example.org/", "example.org-{}"),
        ("http://example.org/../../etc/passwd", "example.org_.._.._etc_passwd-{}"),
        ("http://example.org/%2e%2e/%2e%2e/x", "example.org_.._.._x-{}"),
        ("http://example.org/a%00b", "example.org_a_b-{}"),
        ("file:///etc/hosts", "file_etc_hosts-{}"),
        ("http://.../", "url-{}"),
    ],
)
def test_safe_names(url: str, name: str) -> None:
    tag = hashlib.sha256(url.encode()).hexdigest()[:12]
    assert web.safe_name(url) == name.format(tag)


def test_a_long_path_gives_a_short_name() -> None:
    name = web.safe_name("http://example.org/" + "a" * 5000 + ".txt")
    assert len(name) == web.NAME_STEM + len("-") + 12 + len(".txt")


def assert_stays_inside(name: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,109}", name), name
    root = "/srv/saves"
    assert os.path.dirname(os.path.normpath(os.path.join(root, name))) == root


@given(path=st.text(), query=st.text())
def test_no_url_path_names_a_file_outside_the_directory(path: str, query: str) -> None:
    assert_stays_inside(web.safe_name(f"http://example.org/{path}?{query}"))
    quoted = urllib.parse.quote(path, safe="/%.", errors="surrogatepass")
    assert_stays_inside(web.safe_name(f"http://example.org/{quoted}"))


@given(url=st.text())
def test_no_text_at_all_names_a_file_outside_the_directory(url: str) -> None:
    try:
        name = web.safe_name(url)
    except ValueError:  # urlsplit refuses it (a bad IPv6 host, say): no name, no file
        return
    assert_stays_inside(name)


@pytest.mark.parametrize(
    ("url", "upstream"),
    [
        ("https://Example.org/a?b=1", "https://example.org:443"),
        ("https://example.org:443/b", "https://example.org:443"),
        ("http://example.org/", "http://example.org:80"),
        ("http://example.org:8080/x", "http://example.org:8080"),
        ("HTTP://[::1]:9000/", "http://[::1]:9000"),
        ("file:///etc/hosts", None),
        ("https:///no-host", None),
        ("http://example.org:99999/", None),
        ("not a url", None),
    ],
)
def test_host_of_names_one_upstream_per_scheme_host_and_port(
    url: str, upstream: str | None
) -> None:
    assert web.host_of(batch.Target(url)) == upstream


@pytest.mark.parametrize(
    ("text", "delay"),
    [
        ("User-agent: *\nCrawl-delay: 0.5\n", 0.5),
        ("User-agent: batch-store\nCrawl-delay: 2\n\nUser-agent: *\nCrawl-delay: 9\n", 2.0),
        ("User-agent: Other\nCrawl-delay: 2\n\nUser-agent: *\nDisallow: /x\nCrawl-delay: 3\n", 3.0),
        ("User-agent: a\nUser-agent: *\nCrawl-delay: 4 # slow down\n", 4.0),
        ("User-agent: *\nCrawl-delay: soon\n", None),
        ("User-agent: *\nCrawl-delay: -1\n", None),
        ("User-agent: *\nDisallow: /\n", None),
        ("", None),
    ],
)
def test_robots_delay_reads_the_crawl_delay_asked_of_this_agent(
    text: str, delay: float | None
) -> None:
    assert web.robots_delay(text, "batch-store") == delay
