"""Who may take admin actions over HTTP: a Host that cannot be rebound (an IP address,
localhost, the name the server listens on) and, when sent, an Origin that is that host."""

from __future__ import annotations

import pytest

from zmesh._http.actions import HttpError
from zmesh._http.origin import check_origin


@pytest.mark.parametrize(
    ("host", "origin", "bound"),
    [
        (None, None, "127.0.0.1"),  # (no browser sends a request without Host)
        ("127.0.0.1:8222", "http://127.0.0.1:8222", "127.0.0.1"),
        ("LOCALHOST:8222", "http://localhost:8222", "127.0.0.1"),
        ("[::1]:8222", "http://[::1]:8222", "::1"),
        ("10.0.0.5:9000", None, "0.0.0.0"),  # (a wildcard bind, reached by an address)
        ("ops-1.example:8222", "https://ops-1.example:8222", "ops-1.example"),
        ("localhost:9000", None, "10.0.0.5"),  # (an ssh tunnel)
    ],
)
def test_own_origins_are_let_through(host: str | None, origin: str | None, bound: str) -> None:
    check_origin(host, origin, bound)


@pytest.mark.parametrize(
    ("host", "origin", "bound", "refused"),
    [
        ("rebound.example:8222", None, "127.0.0.1", "Host"),
        ("rebound.example", "http://rebound.example", "0.0.0.0", "Host"),
        ("127.0.0.1:8222", "http://rebound.example:8222", "127.0.0.1", "Origin"),
        ("127.0.0.1:8222", "null", "127.0.0.1", "Origin"),
        ("127.0.0.1:8222", "http://127.0.0.1:8223", "127.0.0.1", "Origin"),
        (None, "http://127.0.0.1:8222", "127.0.0.1", "Origin"),
        ("127.0.0.1:x", None, "127.0.0.1", "Host"),
        ("user@127.0.0.1:8222", None, "127.0.0.1", "Host"),
    ],
)
def test_other_origins_are_refused(
    host: str | None, origin: str | None, bound: str, refused: str
) -> None:
    with pytest.raises(HttpError, match=f"^{refused} ") as info:
        check_origin(host, origin, bound)
    assert info.value.status == 403
