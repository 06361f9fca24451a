"""CurveZMQ keys and the ZAP handler that admits only trusted keys.

Keys are Z85 text (40 characters): a node's secret key file holds its secret key; its
public key is derived from it. Trusted public keys come from a directory of ``*.pub``
files and/or inline strings. The ZAP handler runs on the node's IO thread (a ROUTER bound
at ``inproc://zeromq.zap.01`` in the node's own ZeroMQ context) and also refuses addresses
banned for abuse, with or without CURVE.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from ._dirs import make_dir
from .errors import ConfigError

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"zmesh"
KEY_LEN = 40


def _check_key(text: str, where: str) -> bytes:
    key = text.strip().encode()
    if len(key) != KEY_LEN:
        raise ConfigError(f"{where}: not a CurveZMQ key (want 40 Z85 characters, "
                          f"got {len(key)})")
    try:
        z85.decode(key)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{where}: not a Z85 key: {exc}") from exc
    return key


@dataclass(frozen=True, slots=True)
class Keys:
    """A node's key pair and the public keys it trusts (its own included)."""

    public: bytes
    secret: bytes
    trusted: frozenset[bytes]


def load_keys(secret_key_file: str | None, trusted_keys_dir: str | None,
              trusted_keys: tuple[str, ...]) -> Keys | None:
    """The node's keys, or None when it runs without security."""
    if secret_key_file is None:
        if trusted_keys_dir or trusted_keys:
            raise ConfigError("trusted keys are set but secret_key_file is not: a node needs "
                              "its own key pair to join a secured mesh "
                              "(zmesh keys generate DIR)")
        return None
    path = Path(secret_key_file)
    try:
        secret = _check_key(path.read_text(), str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read secret key file {path}: {exc}") from exc
    public = zmq.curve_public(secret)
    trusted = {public}
    for i, text in enumerate(trusted_keys):
        trusted.add(_check_key(text, f"trusted_keys[{i}]"))
    if trusted_keys_dir:
        tdir = Path(trusted_keys_dir)
        if not tdir.is_dir():
            raise ConfigError(f"trusted_keys_dir {tdir} is not a directory")
        for pub in sorted(tdir.glob("*.pub")):
            trusted.add(_check_key(pub.read_text(), str(pub)))
    return Keys(public, secret, frozenset(trusted))


def generate_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (secret, mode 0600) and ``NAME.pub`` into ``directory``."""
    d = Path(directory)
    make_dir(d, "key directory", ConfigError)
    public, secret = zmq.curve_keypair()
    key_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    if key_path.exists():
        raise ConfigError(f"{key_path} exists; refusing to overwrite a secret key")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.decode() + "\n")
        pub_path.write_text(public.decode() + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write the key pair {name} into {d}: {exc.strerror}") from exc
    return key_path, pub_path


def server_options(sock: zmq.Socket, keys: Keys | None) -> None:
    """Options of a bound socket (PULL, ROUTER): CURVE server when keys are set; ZAP always
    (so banned addresses are refused). Set before bind."""
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)


def client_options(sock: zmq.Socket, keys: Keys | None, server_key: bytes | None) -> None:
    """Options of a connecting socket (PUSH, DEALER) to a server with ``server_key``."""
    if keys is not None and server_key:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


class ZapHandler:
    """Answers ZAP requests: CURVE clients with a trusted key, NULL clients only when the
    node has no keys, and nobody from a banned address."""

    def __init__(self, ctx: zmq.Context, keys: Keys | None, counters: object) -> None:
        self.keys = keys
        self.counters = counters
        self.banned: set[str] = set()
        self._logged: set[tuple[str, bytes]] = set()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)

    def handle(self) -> None:
        """Answer every waiting request (IO thread)."""
        sock = self.sock
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # [routing id, b"", version, request id, domain, address, identity, mechanism,
            #  credentials...]
            if len(frames) < 8:
                continue
            rid, _, version, request_id, _domain, address, _ident, mechanism = frames[:8]
            creds = frames[8:]
            ok, why, user = self._decide(address.decode(errors="replace"), mechanism, creds)
            code = b"200" if ok else b"400"
            sock.send_multipart([rid, b"", version, request_id, code, why.encode(), user, b""])

    def _decide(self, address: str, mechanism: bytes,
                creds: list[bytes]) -> tuple[bool, str, bytes]:
        if address in self.banned:
            return self._deny(address, b"banned", "address banned after repeated bad frames")
        if self.keys is None:
            return (mechanism == b"NULL", "OK", b"")
        if mechanism != b"CURVE" or not creds:
            return self._deny(address, mechanism, "CURVE required")
        key = z85.encode(creds[0])
        if key not in self.keys.trusted:
            return self._deny(address, key, "untrusted key")
        return True, "OK", key

    def _deny(self, address: str, what: bytes, why: str) -> tuple[bool, str, bytes]:
        self.counters.add("auth_denied", 1)  # type: ignore[attr-defined]
        if (address, what) not in self._logged and len(self._logged) < 1000:
            self._logged.add((address, what))
            log.warning("refused a connection from %s: %s (%s)", address, why,
                        what.decode(errors="replace"))
        return False, why, b""

    def close(self) -> None:
        self.sock.close(linger=0)
