"""Who may do what, at run time: the trusted keys and the ACL file (``_acl.py``), read
again when they change or on ``reload`` (SIGHUP in ``zmesh node run``), and the checks
the listener makes with them (IO thread only).

A key taken out of the trusted keys is revoked at once: its peer is forgotten (no more
data to it, its lanes' messages go to other members), and a connection that still speaks
with that key (its hello, its data) is shut down at its next frame; ZAP refuses its new
ones. With an ACL, a peer's hello announces only the subscriptions its key may have
(re-read at each hello, so a grant or a revocation applies within a heartbeat; a reload
takes away at once what is no longer granted), data is taken only from keys that may
publish its topic (a batch refused is handed back, and comes again after its backoff),
and status, admin and fetch requests need their rights. Each denial is counted
(``acl_denied``) and logged once per key and what was denied.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .._acl import Acl
from .._protocol.frames import Hello, SubInfo
from .._security import Keys, load_keys
from .._store.store import WriteBatch
from ..errors import ConfigError

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.5  # how often the files' modification times are looked at
LOGGED_MAX = 10_000  # denials logged (once per key and what)


class Guard:
    """The trusted keys and ACL in force, and the decisions made with them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.counters = engine.counters
        self.acl: Acl | None = None
        self.revoked: set[bytes] = set()
        self._cache: dict[tuple[bytes, str, str], bool] = {}
        self._logged: set[tuple[bytes, str, str]] = set()
        self._stamp = self._files()
        self._next_check = 0.0

    def load(self) -> None:
        """Read the ACL file (at the start; ConfigError when it is not a good one)."""
        cfg = self.config
        self.acl = Acl.load(cfg.acl_file, cfg.trusted_keys_dir) if cfg.acl_file else None
        self._stamp = self._files()

    @property
    def active(self) -> bool:
        """Whether anything is checked (an ACL, or keys revoked since the start)."""
        return self.acl is not None or bool(self.revoked)

    def _files(self) -> tuple[tuple[str, int | None, int | None], ...]:
        """The modification times of the files the keys and the ACL come from."""
        cfg = self.config
        paths = [Path(p) for p in (cfg.secret_key_file, cfg.acl_file) if p]
        if cfg.trusted_keys_dir:
            tdir = Path(cfg.trusted_keys_dir)
            paths.append(tdir)
            with contextlib.suppress(OSError):
                paths += sorted(tdir.glob("*.pub"))
        stamp: list[tuple[str, int | None, int | None]] = []
        for path in paths:
            try:
                st = path.stat()
                stamp.append((str(path), st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append((str(path), None, None))
        return tuple(stamp)

    def tick(self, wb: WriteBatch, now: float) -> None:
        """Reload when the files changed (looked at every CHECK_INTERVAL_S)."""
        if now < self._next_check or self.engine.keys is None:
            return
        self._next_check = now + CHECK_INTERVAL_S
        stamp = self._files()
        if stamp != self._stamp:
            self._stamp = stamp
            self.reload(wb, now)

    def reload(self, wb: WriteBatch, now: float) -> None:
        """Read the trusted keys and the ACL file again; what they no longer allow ends."""
        cfg = self.config
        old = self.engine.keys
        if old is None:
            return
        try:
            keys = load_keys(cfg.secret_key_file, cfg.trusted_keys_dir, cfg.trusted_keys)
        except ConfigError as exc:
            log.error("not reloaded, the keys and permissions in force stay: %s", exc)
            return
        try:
            acl = Acl.load(cfg.acl_file, cfg.trusted_keys_dir) if cfg.acl_file else None
            kept = ""
        except ConfigError as exc:
            # The keys still apply: a key's .pub taken out revokes it even while the ACL
            # names it (and so no longer loads) until the ACL is edited too.
            log.error("the ACL file in force stays: %s", exc)
            acl, kept = self.acl, " (kept: the file has an error)"
        assert keys is not None
        if keys.public != old.public:
            # Its sockets are bound with the pair it started with: a new one would make it
            # one node to some peers and another to the rest.
            log.warning(
                "secret_key_file %s holds another key pair now: the node keeps the one it "
                "started with until it restarts",
                cfg.secret_key_file,
            )
            keys = Keys(old.public, old.secret, keys.trusted | {old.public})
        revoked = old.trusted - keys.trusted
        self._apply(keys, acl)
        self.revoked = (self.revoked | revoked) - keys.trusted
        mesh = self.engine.mesh
        assert mesh is not None
        for peer in list(mesh.peers.values()):
            if peer.public_key in self.revoked:
                mesh.forget(peer, now, "its key was revoked", wb)
            elif acl is not None:
                # (from what it announced: a permission given back restores what it took)
                allowed = self.subs(peer.public_key, peer.announced)
                if allowed == peer.subs:
                    continue
                if peer.alive:
                    mesh.apply_subs(peer, allowed, wb, now)
                else:
                    peer.subs = allowed  # (a dead one's: applied when it is back)
        log.warning(
            "reloaded the trusted keys (%d, %d revoked) and %s%s",
            len(keys.trusted),
            len(revoked),
            f"the ACL file {acl.path}" if acl else "no ACL file",
            kept,
        )

    def _apply(self, keys: Keys, acl: Acl | None) -> None:
        engine = self.engine
        engine.keys = keys
        engine.listener.zap.keys = keys
        if engine.mesh is not None:
            engine.mesh.keys = keys
        self.acl = acl
        self._cache.clear()
        self._logged.clear()

    def allowed(self, key: bytes, action: str, what: str) -> bool:
        """Whether ``key`` may ``publish``/``subscribe`` topic ``what``, or use the admin
        right ``what``; a denial is counted, and logged once."""
        keys = self.engine.keys
        if not key or keys is None or key == keys.public:
            return True  # (this node itself, or a node without keys)
        if key in self.revoked:
            return False
        if self.acl is None:
            return True
        memo = (key, action, what)
        ok = self._cache.get(memo)
        if ok is None:
            ok = self._cache[memo] = self.acl.may(key, action, what)
        if not ok:
            self.counters.add("acl_denied", 1)
            if memo not in self._logged and len(self._logged) < LOGGED_MAX:
                self._logged.add(memo)
                log.warning(
                    "key %s may not %s %s (acl_file %s)",
                    key.decode(),
                    "use the admin right" if action == "admin" else action,
                    what,
                    self.acl.path,
                )
        return ok

    def subs(self, key: bytes, subs: tuple[SubInfo, ...]) -> tuple[SubInfo, ...]:
        """Those of a hello's subscriptions its key may have."""
        return tuple(s for s in subs if self.allowed(key, "subscribe", s.topic))

    def hello(self, msg: Hello, key: bytes) -> Hello:
        """A hello with only the subscriptions its key may have."""
        subs = self.subs(key, msg.subs)
        return msg if subs == msg.subs else replace(msg, subs=subs)

    def refusal(self, key: bytes, right: str) -> str:
        return (
            f"key {key.decode() or '(none)'} may not use the admin right {right!r} of "
            f"this node (acl_file {self.acl.path if self.acl else '-'})"
        )
