"""CurveZMQ keys and the ZAP handler that admits only trusted keys.

Keys are Z85 text (40 characters): a node's secret key file holds its secret key; its
public key is derived from it. Trusted public keys come from a directory of ``*.pub``
files and/or inline strings. The ZAP handler runs on the node's IO thread (a ROUTER bound
at ``inproc://zeromq.zap.01`` in the node's own ZeroMQ context). It gives every connection
an id (the ``X-Conn`` property of its frames), by which abuse is counted per connection
(_engine/bans.py), and handles banned addresses and keys, with or without CURVE: refused
at the data socket; at the control socket admitted with an ``X-Ban`` property, so that a
status request gets a reply saying why before the connection is shut down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
from zmq.utils import z85

from ._dirs import make_dir
from .errors import ConfigError

if TYPE_CHECKING:
    from ._engine.bans import Bans
    from ._engine.stats import Counters

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
CONTROL_DOMAIN = b"zmesh-control"  # the ZAP domain of the ROUTER; the PULL's:
DATA_DOMAIN = b"zmesh-data"
KEY_LEN = 40
_Z85_CHARS = frozenset(z85.Z85CHARS.decode())


def read_key(path: Path, what: str = "") -> bytes:
    """The key in the file ``path`` (``what``: the setting that names it, said first);
    ConfigError when it cannot be read (a directory, gone, not text) or holds none."""
    where = f"{what} {_shown(path)}" if what else str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{where}: cannot read it ({why})") from exc
    return _check_key(text, where)


def _check_key(text: str, where: str) -> bytes:
    text = text.strip().lstrip("\ufeff")  # (a byte-order mark some editors write first)
    if len(text) != KEY_LEN:
        raise ConfigError(f"{where}: not a CurveZMQ key (want 40 Z85 characters, got {len(text)})")
    bad = next((c for c in text if c not in _Z85_CHARS), None)
    if bad is not None:
        raise ConfigError(f"{where}: not a Z85 key ({bad!r} is not a Z85 character)")
    key = text.encode()
    try:
        z85.decode(key)
    except struct.error as exc:  # (five characters past 2**32)
        raise ConfigError(f"{where}: not a Z85 key (it decodes to no 32-byte key)") from exc
    return key


@dataclass(frozen=True, slots=True)
class Keys:
    """A node's key pair and the public keys it trusts (its own included)."""

    public: bytes
    secret: bytes
    trusted: frozenset[bytes]


def load_keys(
    secret_key_file: str | None, trusted_keys_dir: str | None, trusted_keys: tuple[str, ...]
) -> Keys | None:
    """The node's keys, or None when it runs without security."""
    if secret_key_file is None:
        if trusted_keys_dir or trusted_keys:
            raise ConfigError(
                "trusted keys are set but secret_key_file is not: a node needs "
                "its own key pair to join a secured mesh "
                "(zmesh keys generate DIR)"
            )
        return None
    path = Path(secret_key_file)
    if path.suffix == ".pub":
        raise ConfigError(
            f"secret_key_file {path} is a public key (NAME.pub): give the secret one, NAME.key"
        )
    secret = read_key(path, "secret_key_file")
    public = zmq.curve_public(secret)
    trusted = {public}
    for i, text in enumerate(trusted_keys):
        trusted.add(_check_key(text, f"trusted_keys[{i}]"))
    if trusted_keys_dir:
        tdir = Path(trusted_keys_dir)
        if not tdir.is_dir():
            raise ConfigError(f"trusted_keys_dir {_shown(tdir)} is not a directory")
        for pub in sorted(tdir.glob("*.pub")):
            trusted.add(read_key(pub))
    _check_pair(path, secret, public, trusted)
    return Keys(public, secret, frozenset(trusted))


def _check_pair(path: Path, secret: bytes, public: bytes, trusted: set[bytes]) -> None:
    """ConfigError when ``path`` holds a public key (one the node trusts, or not the pair
    of the NAME.pub beside it): the node would run under a key no peer trusts. A warning
    when others than its owner may read it."""
    pub = path.with_suffix(".pub")
    if secret in trusted - {public}:
        raise ConfigError(
            f"secret_key_file {_shown(path)} holds a key the node trusts as a public "
            "key: give the secret one (NAME.key), or take this secret key out of the "
            "trusted keys"
        )
    try:
        beside: bytes | None = _check_key(pub.read_text(), str(pub))
    except (OSError, UnicodeDecodeError, ConfigError):
        beside = None  # (no NAME.pub beside it, or none that is a key: nothing to compare)
    if beside is not None and beside != public:
        raise ConfigError(
            f"secret_key_file {_shown(path)} is not the secret key of {pub.name} beside "
            f"it (its public key is {public.decode()}): a public key in a .key file, or "
            "a pair mixed up"
        )
    with contextlib.suppress(OSError):
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "secret_key_file %s may be read by others than its owner (mode %o): chmod 600 it",
                path,
                stat.S_IMODE(path.stat().st_mode),
            )


def _shown(path: Path) -> str:
    """``path`` as given, and where a relative one leads (from the working directory)."""
    return str(path) if path.is_absolute() else f"{path} (that is {path.absolute()})"


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


def server_options(sock: zmq.Socket[bytes], keys: Keys | None, domain: bytes) -> None:
    """Options of a bound socket (PULL, ROUTER): CURVE server when keys are set; ZAP always
    (every connection gets an id, banned ones are refused). Set before bind."""
    sock.setsockopt(zmq.ZAP_DOMAIN, domain)
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)


def client_options(sock: zmq.Socket[bytes], keys: Keys | None, server_key: bytes | None) -> None:
    """Options of a connecting socket (PUSH, DEALER) to a server with ``server_key``."""
    if keys is not None and server_key:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


class ZapHandler:
    """Answers ZAP requests: CURVE clients with a trusted key, NULL clients only when the
    node has no keys; banned addresses and keys as the module says."""

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], keys: Keys | None, counters: Counters, bans: Bans
    ) -> None:
        self.keys = keys
        self.counters = counters
        self.bans = bans
        self._logged: set[tuple[str, bytes]] = set()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)

    def handle(self, now: float) -> None:
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
            rid, _, version, request_id, domain, address, _ident, mechanism = frames[:8]
            ok, why, user, props = self._decide(
                address.decode(errors="replace"), domain, mechanism, frames[8:], now
            )
            sock.send_multipart(
                [
                    rid,
                    b"",
                    version,
                    request_id,
                    b"200" if ok else b"400",
                    why.encode(),
                    user,
                    properties(props) if ok else b"",
                ]
            )

    def _decide(
        self, address: str, domain: bytes, mechanism: bytes, creds: list[bytes], now: float
    ) -> tuple[bool, str, bytes, dict[str, str]]:
        key = b""
        if self.keys is None:
            if mechanism != b"NULL":
                return self._deny(address, mechanism, "this node has no CURVE keys")
        elif mechanism != b"CURVE" or not creds:
            return self._deny(address, mechanism, "CURVE required")
        else:
            key = z85.encode(creds[0])
            if key not in self.keys.trusted:
                return self._deny(address, key, "untrusted key")
        props = {"X-Conn": self.bans.new_conn()}
        ban = self.bans.find(address, key.decode(), now)
        if ban is not None:
            if domain != CONTROL_DOMAIN:
                return self._deny(address, b"banned", ban.text())
            props["X-Ban"] = ban.text()  # (its request is answered, then it is shut down)
        return True, "OK", key, props

    def _deny(self, address: str, what: bytes, why: str) -> tuple[bool, str, bytes, dict[str, str]]:
        self.counters.add("auth_denied", 1)
        if (address, what) not in self._logged and len(self._logged) < 1000:
            self._logged.add((address, what))
            log.warning(
                "refused a connection from %s: %s (%s)", address, why, what.decode(errors="replace")
            )
        return False, why[:255], b"", {}

    def close(self) -> None:
        self.sock.close(linger=0)


def properties(props: dict[str, str]) -> bytes:
    """ZMTP metadata (a ZAP reply's last frame): name length, name, value length, value."""
    out = bytearray()
    for name, value in props.items():
        data = value.encode()
        out += bytes([len(name)]) + name.encode() + len(data).to_bytes(4, "big") + data
    return bytes(out)
