"""A client private key that never leaves its PKCS#11 token.

`Pkcs11PrivateKey` is a `cryptography` RSA private key whose `sign` and `decrypt` run on the
token (the key object is non-extractable there), so asyncua and `cryptography` use it like
any other key. A module (the vendor's ``.so``) is loaded once per process and initialised
without OS locking, so one lock per module serialises every call into it: asyncua signs and
decrypts from its event-loop thread while the adapter opens and closes tokens from others.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import pkcs11
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.asymmetric import rsa
from pkcs11 import MGF, Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.exceptions import PKCS11Error

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.utils import NoDigestInfo, Prehashed

from unskit.errors import ConfigError, ConfigIssue, DeviceError
from unskit.opcua.config import Pkcs11Key

__all__ = ["Pkcs11PrivateKey", "Pkcs11Token"]

# PKCS1v15 signatures: the mechanism that hashes on the token, per hash name.
_PKCS1_SIGN = {
    "sha1": Mechanism.SHA1_RSA_PKCS,
    "sha256": Mechanism.SHA256_RSA_PKCS,
    "sha384": Mechanism.SHA384_RSA_PKCS,
    "sha512": Mechanism.SHA512_RSA_PKCS,
}
_PSS_SIGN = {
    "sha256": (Mechanism.SHA256_RSA_PKCS_PSS, Mechanism.SHA256, MGF.SHA256),
    "sha384": (Mechanism.SHA384_RSA_PKCS_PSS, Mechanism.SHA384, MGF.SHA384),
    "sha512": (Mechanism.SHA512_RSA_PKCS_PSS, Mechanism.SHA512, MGF.SHA512),
}
# OAEP decryption (label empty): RSA-OAEP (SHA-1) and RSA-OAEP-SHA256 of the OPC UA policies.
_OAEP = {
    "sha1": (Mechanism.SHA_1, MGF.SHA1),
    "sha256": (Mechanism.SHA256, MGF.SHA256),
}


class _Module:
    """One loaded PKCS#11 library, shared by every token opened on it in this process."""

    _registry: ClassVar[dict[str, _Module]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.lib = pkcs11.lib(path)
        self.users = 1
        #: The logged-in session per slot id, shared by every Pkcs11Token on that slot.
        self.logins: dict[int, _Login] = {}

    @classmethod
    def acquire(cls, path: str) -> _Module:
        """The module at `path`, loaded and initialised; pair with `release`."""
        with cls._registry_lock:
            module = cls._registry.get(path)
            if module is None:
                module = cls(path)
                cls._registry[path] = module
                return module
            with module.lock:
                if module.users == 0:
                    # C_Initialize again: a module reads its configuration there (SoftHSM's
                    # SOFTHSM2_CONF), and a second lib object would finalise the first's.
                    module.lib.initialize()
                module.users += 1
            return module

    def release(self) -> None:
        """Drops one user; the last one finalises the module (it stays loaded)."""
        with type(self)._registry_lock, self.lock:
            self.users -= 1
            if self.users == 0:
                # Nothing is open on it any more; the next acquire initialises it again.
                with contextlib.suppress(PKCS11Error):
                    self.lib.finalize()


class _Login:
    """One logged-in session on a token. PKCS#11 login state belongs to the process, not
    the session (a second C_Login fails, and python-pkcs11's close logs every session
    out), so all users of a token share this one, counted."""

    def __init__(self, session: pkcs11.Session, pin: str, rw: bool) -> None:
        self.session = session
        self.rw = rw
        self.users = 1
        # The PIN itself is not kept; a later opener's PIN is compared with this digest.
        self._salt = os.urandom(16)
        self._digest = self.digest(pin)

    def digest(self, pin: str) -> bytes:
        return hashlib.sha256(self._salt + pin.encode()).digest()

    def matches(self, pin: str) -> bool:
        return hmac.compare_digest(self._digest, self.digest(pin))


class Pkcs11Token:
    """One use of a logged-in token; every call into the module holds its lock. `path` is
    the JSON path of the clientCertificate whose modulePath, slotIndex and pin it names."""

    def __init__(
        self,
        module_path: str,
        slot_index: int,
        pin: str,
        *,
        rw: bool = False,
        path: str = "connection.clientCertificate",
        pin_key: str = "pin",
    ) -> None:
        self.module_path = module_path
        self.slot_index = slot_index
        self._path = path
        try:
            self._module = _Module.acquire(module_path)
        except PKCS11Error as exc:
            raise _config_error(
                f"{path}.modulePath", f"cannot load PKCS#11 module {module_path}: {exc}"
            ) from None
        try:
            with self._module.lock:
                slots = self._module.lib.get_slots(token_present=True)
                if not 0 <= slot_index < len(slots):
                    raise _config_error(
                        f"{path}.slotIndex",
                        f"slot index {slot_index} is out of range: module {module_path} "
                        f"has {len(slots)} slot(s) with a token",
                    )
                slot = slots[slot_index]
                self._slot_id = slot.slot_id
                token = slot.get_token()
                self.token_label = token.label
                login = self._module.logins.get(self._slot_id)
                if login is None:
                    login = _Login(token.open(rw=rw, user_pin=pin), pin, rw)
                    self._module.logins[self._slot_id] = login
                elif not login.matches(pin):
                    raise _config_error(
                        f"{path}.{pin_key}",
                        f"token {token.label!r} in slot index {slot_index} is already open "
                        "in this process with another PIN",
                    )
                elif rw and not login.rw:
                    raise _config_error(path, "token is already open read-only")
                else:
                    login.users += 1
                self._session: pkcs11.Session | None = login.session
        except PKCS11Error as exc:
            self._module.release()
            raise _config_error(
                f"{path}.{pin_key}",
                f"token in slot index {slot_index} of {module_path} refused the login: "
                f"{_describe(exc)}",
            ) from None
        except BaseException:
            self._module.release()
            raise

    @classmethod
    def open(
        cls,
        key: Pkcs11Key,
        environ: Mapping[str, str] | None = None,
        *,
        path: str = "connection.clientCertificate",
    ) -> Pkcs11Token:
        """Opens and logs in to the token `key` names, its PIN inline or from `pinEnv`."""
        env = os.environ if environ is None else environ
        if key.pin is not None:
            pin, pin_key = key.pin, "pin"
        elif key.pin_env is not None:
            value = env.get(key.pin_env)
            if not value:
                raise _config_error(
                    f"{path}.pinEnv",
                    f"the PIN variable {key.pin_env} named by pinEnv is not set",
                )
            pin, pin_key = value, "pinEnv"
        else:
            raise _config_error(path, "a PKCS#11 token needs pin or pinEnv")
        return cls(key.module_path, key.slot_index, pin, path=path, pin_key=pin_key)

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return (
            f"Pkcs11Token({self.module_path!r}, slot_index={self.slot_index}, "
            f"label={self.token_label!r}, {state})"
        )

    def __enter__(self) -> Pkcs11Token:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[pkcs11.Session]:
        """The raw session, held under the module lock (for provisioning a token)."""
        with self._module.lock:
            if self._session is None:
                raise DeviceError(f"{self!r} is closed")
            yield self._session

    def private_key(self, label: str) -> Pkcs11PrivateKey:
        """The RSA private key labelled `label` (empty: the token's only one)."""
        where = f"{self._path}.keyLabel"
        with self.session() as session:
            found = _find(session, ObjectClass.PRIVATE_KEY, label)
            if len(found) != 1:
                raise _config_error(where, _count_message("private key", label, found, self))
            key = found[0]
            try:
                if key[Attribute.KEY_TYPE] != KeyType.RSA:
                    raise _config_error(where, f"private key {label!r} is not an RSA key")
                # Modulus and public exponent are public attributes even of a sensitive key.
                modulus = int.from_bytes(key[Attribute.MODULUS], "big")
                exponent = int.from_bytes(key[Attribute.PUBLIC_EXPONENT], "big")
            except PKCS11Error as exc:
                raise _config_error(where, f"cannot read key {label!r}: {_describe(exc)}") from None
        public = rsa.RSAPublicNumbers(exponent, modulus).public_key()
        return Pkcs11PrivateKey(self, key, public, label)

    def certificate(self, label: str) -> x509.Certificate:
        """The X.509 certificate object labelled `label` (empty: the token's only one)."""
        where = f"{self._path}.certLabel"
        with self.session() as session:
            found = _find(session, ObjectClass.CERTIFICATE, label)
            if len(found) != 1:
                raise _config_error(where, _count_message("certificate", label, found, self))
            try:
                der = bytes(found[0][Attribute.VALUE])
            except PKCS11Error as exc:
                raise _config_error(
                    where, f"cannot read certificate {label!r}: {_describe(exc)}"
                ) from None
        try:
            return x509.load_der_x509_certificate(der)
        except ValueError:
            raise _config_error(where, f"certificate {label!r} is not DER X.509") from None

    def close(self) -> None:
        """Ends this use of the token; the last one logs out. Closing twice does nothing."""
        with self._module.lock:
            session, self._session = self._session, None
            if session is None:
                return
            login = self._module.logins[self._slot_id]
            login.users -= 1
            if login.users == 0:
                del self._module.logins[self._slot_id]
                # A removed token: nothing is left to close.
                with contextlib.suppress(PKCS11Error):
                    session.close()
        self._module.release()


class Pkcs11PrivateKey(rsa.RSAPrivateKey):
    """An RSA key on a token: sign (PKCS1v15, PSS) and decrypt (OAEP) run there; the key
    material cannot be read."""

    def __init__(self, token: Pkcs11Token, key: Any, public: rsa.RSAPublicKey, label: str) -> None:
        self._token = token
        self._key = key
        self._public = public
        self.label = label

    def __repr__(self) -> str:
        return f"Pkcs11PrivateKey(label={self.label!r}, key_size={self.key_size})"

    @property
    def token(self) -> Pkcs11Token:
        return self._token

    @property
    def key_size(self) -> int:
        return self._public.key_size

    def public_key(self) -> rsa.RSAPublicKey:
        return self._public

    def sign(
        self,
        data: bytes,
        padding: asym_padding.AsymmetricPadding,
        algorithm: hashes.HashAlgorithm | Prehashed | NoDigestInfo,
    ) -> bytes:
        mechanism, param = self._sign_mechanism(padding, algorithm)
        return self._call("sign", bytes(data), mechanism, param)

    def decrypt(self, ciphertext: bytes, padding: asym_padding.AsymmetricPadding) -> bytes:
        mechanism, param = self._decrypt_mechanism(padding)
        return self._call("decrypt", bytes(ciphertext), mechanism, param)

    def private_numbers(self) -> NoReturn:
        raise TypeError(f"{self!r} lives on a PKCS#11 token and cannot be exported")

    def private_bytes(
        self,
        encoding: serialization.Encoding,
        format: serialization.PrivateFormat,
        encryption_algorithm: serialization.KeySerializationEncryption,
    ) -> NoReturn:
        raise TypeError(f"{self!r} lives on a PKCS#11 token and cannot be exported")

    def __copy__(self) -> Pkcs11PrivateKey:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Pkcs11PrivateKey:
        return self

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError(f"{self!r} cannot be pickled")

    def _sign_mechanism(
        self, pad: asym_padding.AsymmetricPadding, algorithm: object
    ) -> tuple[Mechanism, Any]:
        if not isinstance(algorithm, hashes.HashAlgorithm):
            raise UnsupportedAlgorithm("a PKCS#11 key signs the message, not a prehashed digest")
        if isinstance(pad, asym_padding.PKCS1v15) and algorithm.name in _PKCS1_SIGN:
            return _PKCS1_SIGN[algorithm.name], None
        if isinstance(pad, asym_padding.PSS) and algorithm.name in _PSS_SIGN:
            mechanism, hash_mechanism, mgf = _PSS_SIGN[algorithm.name]
            mgf_hash = getattr(pad.mgf, "_algorithm", None)
            if mgf_hash is None or mgf_hash.name != algorithm.name:
                raise UnsupportedAlgorithm("PSS on a PKCS#11 key needs MGF1 with the same hash")
            return mechanism, (hash_mechanism, mgf, self._salt_length(pad, algorithm))
        raise UnsupportedAlgorithm(
            f"a PKCS#11 key signs with PKCS1v15 (SHA-1/2) or PSS (SHA-2), "
            f"not {pad.name} with {algorithm.name}"
        )

    def _salt_length(self, pad: asym_padding.PSS, algorithm: hashes.HashAlgorithm) -> int:
        salt = getattr(pad, "_salt_length", None)
        if isinstance(salt, int):
            return salt
        if salt is asym_padding.PSS.DIGEST_LENGTH:
            return algorithm.digest_size
        if salt is asym_padding.PSS.MAX_LENGTH:
            return (self.key_size + 7) // 8 - algorithm.digest_size - 2
        raise UnsupportedAlgorithm("PSS on a PKCS#11 key needs a salt length (not AUTO)")

    @staticmethod
    def _decrypt_mechanism(pad: asym_padding.AsymmetricPadding) -> tuple[Mechanism, Any]:
        if isinstance(pad, asym_padding.OAEP):
            algorithm = pad.algorithm
            mgf_hash = getattr(pad.mgf, "_algorithm", None)
            if (
                algorithm.name in _OAEP
                and mgf_hash is not None
                and mgf_hash.name == algorithm.name
                and not pad._label
            ):
                hash_mechanism, mgf = _OAEP[algorithm.name]
                return Mechanism.RSA_PKCS_OAEP, (hash_mechanism, mgf, None)
        # PKCS1v15 decryption (Basic128Rsa15, a deprecated policy) is refused on purpose.
        raise UnsupportedAlgorithm(
            f"a PKCS#11 key decrypts RSA-OAEP with SHA-1 or SHA-256 only, not {pad.name}"
        )

    def _call(self, operation: str, data: bytes, mechanism: Mechanism, param: Any) -> bytes:
        try:
            with self._token.session():
                if operation == "sign":
                    out = self._key.sign(data, mechanism=mechanism, mechanism_param=param)
                else:
                    out = self._key.decrypt(data, mechanism=mechanism, mechanism_param=param)
        except PKCS11Error as exc:
            raise DeviceError(
                f"PKCS#11 {operation} with key {self.label!r} failed: {_describe(exc)}",
                code=type(exc).__name__,
            ) from None
        assert isinstance(out, bytes)
        return out


def _find(session: pkcs11.Session, object_class: ObjectClass, label: str) -> list[Any]:
    attrs: dict[Attribute, Any] = {Attribute.CLASS: object_class}
    if label:
        attrs[Attribute.LABEL] = label
    return list(session.get_objects(attrs))


def _count_message(kind: str, label: str, found: list[Any], token: Pkcs11Token) -> str:
    where = f"token {token.token_label!r} (slot index {token.slot_index})"
    if not label:
        return f"{where} holds {len(found)} {kind} objects; name one by its label"
    if not found:
        return f"{where} has no {kind} labelled {label!r}"
    return f"{where} has {len(found)} {kind} objects labelled {label!r}"


def _describe(exc: PKCS11Error) -> str:
    # python-pkcs11 raises one class per CKR_ code, often without a message.
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _config_error(path: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, message)])
