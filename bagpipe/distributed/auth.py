"""The job's secret: where a role finds it, how it proves it holds it, the keys it derives.

Every role of a job holds the same secret (at least :data:`MIN_SECRET_BYTES` bytes).
The local launcher makes a new one for every attempt (``secrets.token_bytes``) and
hands it to its roles in the environment variable :data:`SECRET_ENV`, never on a
command line; roles started by ``torchrun`` or by hand read it from that variable or
from a file (``--secret-file``, or the variable :data:`SECRET_FILE_ENV`) that only its
owner may read: a file that its group or others may read or write is refused.

Joining (:meth:`bagpipe.distributed.transport.Transport.join`), two roles that talk
prove to each other that they hold the secret, challenge and response: each sends a
fresh random nonce and answers the other's with :func:`proof`. Both then derive the
pair's session keys (:func:`session_keys`) from the secret and both nonces, one per
direction, and every later message between them carries an HMAC-SHA256 under the
sender's key over its header and body. A message recorded in another job, in an
earlier attempt of this one, or sent the other way, fails its MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from bagpipe.errors import BagpipeError, ConfigError

SECRET_ENV = "BAGPIPE_JOB_SECRET"
SECRET_FILE_ENV = "BAGPIPE_JOB_SECRET_FILE"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32
PROTOCOL_VERSION = 2  # 2: the handshake carries the role's settings (bagpipe.config.agreement)


class AuthError(BagpipeError):
    """A peer did not prove that it holds the job's secret (or sent a forged handshake)."""


def new_secret() -> bytes:
    """A fresh job secret: 32 random bytes as 64 hex digits (printable, so it fits an environment variable)."""
    return secrets.token_hex(32).encode()


def token_nonce() -> bytes:
    """A fresh challenge (one per pair and handshake)."""
    return secrets.token_bytes(NONCE_BYTES)


def write_secret_file(path: Path, secret: bytes) -> Path:
    """Write ``secret`` to ``path``, created with mode 0600 (never readable by others, not even briefly)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return path


def read_secret_file(path: str | Path) -> bytes:
    """The secret in ``path``; refuses a file its group or others may read or write."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise ConfigError(f"the job's secret file {path} cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):  # /dev/null, a pipe: its mode bits are not the owner's to change
        raise ConfigError(
            f"the job's secret file {path} is not a regular file; give a file of its own, readable by its owner "
            "only, e.g. `(umask 077; openssl rand -hex 32 > job.secret)` and --secret-file job.secret"
        )
    try:
        data = path.read_bytes().strip()
    except OSError as e:
        raise ConfigError(f"the job's secret file {path} cannot be read ({e.strerror})") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the job's secret file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read it; "
            f"make it readable by its owner only (chmod 600 {path})"
        )
    return _checked(data, str(path))


def load_secret(secret_file: str | None = None, environ: dict | None = None) -> bytes:
    """The job's secret: from ``secret_file`` if given, else $BAGPIPE_JOB_SECRET, else
    the file named by $BAGPIPE_JOB_SECRET_FILE; a ConfigError that says how to give one
    when there is none."""
    env = os.environ if environ is None else environ
    if secret_file:
        return read_secret_file(secret_file)
    if env.get(SECRET_ENV):
        return _checked(env[SECRET_ENV].encode(), f"${SECRET_ENV}")
    if env.get(SECRET_FILE_ENV):
        return read_secret_file(env[SECRET_FILE_ENV])
    raise ConfigError(
        f"a distributed role needs the job's secret: set {SECRET_ENV} (the same value on every machine) or give "
        f"--secret-file FILE (mode 0600), e.g. `(umask 077; openssl rand -hex 32 > job.secret)` "
        "(`bagpipe train --trainers N --servers S` makes one for its roles itself)"
    )


def _checked(secret: bytes, where: str) -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"the job's secret in {where} is {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return secret


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"\x00".join(parts), hashlib.sha256)


def hello_key(secret: bytes, src: int, dst: int) -> bytes:
    """The key of the handshake's messages from rank ``src`` to ``dst``."""
    return _mac(secret, b"bagpipe hello", b"%d->%d" % (src, dst))


def proof(secret: bytes, prover: int, verifier: int, challenge: bytes, own_nonce: bytes) -> bytes:
    """What rank ``prover`` answers to ``verifier``'s ``challenge`` (a nonce): only a holder
    of the secret can compute it, and it is good for this pair and these nonces only."""
    return _mac(secret, b"bagpipe proof", b"%d->%d" % (prover, verifier), challenge, own_nonce)


def session_keys(secret: bytes, me: int, peer: int, my_nonce: bytes, peer_nonce: bytes) -> tuple[bytes, bytes]:
    """(key of my messages to ``peer``, key of its messages to me) after a handshake."""
    lo, hi = sorted((me, peer))
    n_lo, n_hi = (my_nonce, peer_nonce) if me < peer else (peer_nonce, my_nonce)
    pair = _mac(secret, b"bagpipe session", b"%d,%d" % (lo, hi), n_lo, n_hi)
    return _mac(pair, b"%d->%d" % (me, peer)), _mac(pair, b"%d->%d" % (peer, me))


def same(a: bytes, b: bytes) -> bool:
    """Constant-time comparison of two MACs."""
    return hmac.compare_digest(a, b)
