"""Configuration documents from the edge runtime: the `ConfigProvider`s of RUNTIME_CONFIG
(this component's own configuration), CONFIG_COMPONENT (another component's) and SHADOW
(a named shadow's desired state).

Each provider owns one `IpcConnection`, opened on first use from the variables the runtime
hands the component, and implements the config layer's `ConfigProvider` protocol
(`location`, `get_configuration`, `subscribe`) without importing it (edge/ is layer 1).
Every failure is a `ConfigError` naming the source (what could not be read, and where), so
that a component refuses to start with exit 2 rather than a traceback.

Stream events arrive on the SDK's event-loop thread; they only wake a worker thread of the
provider's own, which does the IPC work (re-reading the configuration or the shadow) and
calls back. The nucleus sends one configuration event per changed key, so the worker
re-reads once the events of a burst have stopped for `QUIET_S`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from unskit.edge import configuration as ipc_config
from unskit.edge import shadow as ipc_shadow
from unskit.edge.connection import IpcConnection, IpcEndpoint
from unskit.errors import AccessDeniedError, ConfigError, ConfigIssue, EdgeRuntimeError

__all__ = [
    "QUIET_S",
    "STATUS_KEY",
    "ComponentConfigProvider",
    "RuntimeConfigProvider",
    "ShadowProvider",
    "runtime_document",
]

_log = logging.getLogger(__name__)

#: A burst of per-key configuration events is over once none came for this long.
QUIET_S = 0.2
#: How long the start waits for the shadow manager (it refuses calls for about a second
#: after the nucleus started it).
SHADOW_START_S = 15.0
#: The reported-state key under which the outcome of each desired state is written.
STATUS_KEY = "unskit"
#: The configuration key that belongs to the runtime, never to the document.
_ACCESS_CONTROL = "accessControl"

OnDocument = Callable[[dict[str, Any]], None]
OnError = Callable[[ConfigError], None]
#: A document -> the error messages that refuse it, or None when it is accepted.
Validate = Callable[[dict[str, Any]], "list[str] | None"]


def runtime_document(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """A component configuration made a document: `accessControl` (the runtime's, never the
    document's) removed, and every whole float made an int.

    The nucleus keeps numbers as doubles: after a deployment 31 comes back as 31.0, which the
    schema's integer rule (a file's ``30.0`` is refused) would refuse. The runtime has no way
    to say 31, so a whole float from it is taken as the integer; 31.5 stays a float (and is
    refused where an integer is required). A number key accepts the int alike."""

    def plain(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value

    return {str(k): plain(v) for k, v in configuration.items() if k != _ACCESS_CONTROL}


def _issue(message: str, source: str, path: str = "$") -> ConfigError:
    return ConfigError([ConfigIssue(path, message)], source=source)


class _Watch:
    """A running subscription: its streams and its worker; `close` ends both."""

    def __init__(self, streams: list[ipc_config.Stream], worker: _Worker) -> None:
        self._streams = streams
        self._worker = worker

    def close(self) -> None:
        """Stops watching; idempotent."""
        self._worker.close()  # first: the streams' close is then not reported as a loss
        for stream in self._streams:
            stream.close()


class _Worker:
    """One thread that runs `work` after each burst of `poke`s (coalesced: the burst is over
    once no poke came for `quiet` seconds); `poke` only sets a flag, so it is safe on the
    SDK's event-loop thread."""

    def __init__(self, name: str, work: Callable[[], None], quiet: float = QUIET_S) -> None:
        self._work = work
        self._quiet = quiet
        self._cond = threading.Condition()
        self._pokes = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def poke(self) -> None:
        with self._cond:
            self._pokes += 1
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pokes > 0 or self._closed)
                # Coalesce: wait until a quiet period passes with no new poke.
                while not self._closed:
                    seen = self._pokes
                    self._cond.wait(self._quiet)
                    if self._pokes == seen:
                        break
                if self._closed:
                    return
                self._pokes = 0
            try:
                self._work()
            except Exception:  # the watch must outlive one failed re-read
                _log.exception("edge runtime: configuration watch failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _ended(worker: _Worker, what: str) -> Callable[[str], None]:
    """A stream's close callback: a warning, unless the watch itself was closed."""

    def ended(reason: str) -> None:
        if not worker.closed:
            _log.warning("edge runtime: %s: %s", what, reason)

    return ended


class _Connected:
    """The provider's connection, opened on first use."""

    def __init__(self, environ: Mapping[str, str] | None) -> None:
        self._environ = environ
        self._lock = threading.Lock()
        self._connection: IpcConnection | None = None

    def connection(self) -> IpcConnection:
        with self._lock:
            if self._connection is None or not self._connection.is_connected():
                connection = IpcConnection(IpcEndpoint.from_environment(self._environ))
                connection.connect()
                self._connection = connection
            return self._connection

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class _ConfigurationProvider:
    """A component's configuration (this component's when `component` is None), followed
    with SubscribeToConfigurationUpdate; shared by RUNTIME_CONFIG and CONFIG_COMPONENT."""

    def __init__(self, component: str | None, environ: Mapping[str, str] | None) -> None:
        self.component = component
        self._ipc = _Connected(environ)
        self._last: dict[str, Any] | None = None  # the document last handed out

    @property
    def location(self) -> str:
        """What is read, for messages."""
        if self.component is None:
            return "the edge runtime's configuration of this component (GetConfiguration)"
        return f"the edge runtime's configuration of component {self.component!r}"

    def _read(self) -> dict[str, Any]:
        try:
            return runtime_document(
                ipc_config.get_configuration(self._ipc.connection(), self.component)
            )
        except EdgeRuntimeError as exc:
            raise _issue(str(exc), self.location) from None

    def get_configuration(self) -> Mapping[str, Any]:
        """The document (the configuration without its accessControl)."""
        document = self._read()
        self._last = document
        return document

    def subscribe(self, on_update: OnDocument, on_error: OnError) -> _Watch:
        """Calls `on_update` (on a worker thread) with the whole document after each burst of
        changes that changed it (and once at the start if it changed since it was read)."""

        def reread() -> None:
            try:
                document = self._read()
            except ConfigError as exc:
                on_error(exc)
                return
            if document == self._last:
                return  # e.g. only accessControl changed
            self._last = document
            on_update(document)

        worker = _Worker("unskit-edge-config", reread)
        try:
            stream = ipc_config.subscribe_to_configuration_update(
                self._ipc.connection(),
                self.component,
                lambda _key_path: worker.poke(),
                _ended(worker, f"{self.location} is no longer followed"),
            )
        except EdgeRuntimeError as exc:
            worker.close()
            raise _issue(str(exc), self.location) from None
        worker.poke()  # a change between the read and the subscription is not lost
        return _Watch([stream], worker)

    def close(self) -> None:
        """Closes the IPC connection."""
        self._ipc.close()


class RuntimeConfigProvider(_ConfigurationProvider):
    """RUNTIME_CONFIG: this component's own configuration (GetConfiguration, key path []);
    needs no accessControl policy. `validate` (see `subscribe_validation`) refuses a
    deployment's configuration before the runtime applies it."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(None, environ)

    def subscribe_validation(self, validate: Validate) -> _Watch:
        """Answers every deployment's proposed configuration of this component (on a worker
        thread): ACCEPTED when `validate` returns None, else REJECTED with its messages, so the
        deployment fails (COMPONENT_CONFIGURATION_NOT_VALID) and the running one stays."""
        pending: list[ipc_config.ValidationRequest] = []
        lock = threading.Lock()

        def answer() -> None:
            with lock:
                requests = pending[:]
                pending.clear()
            for request in requests:
                self._answer(request, validate)

        # Validation requests are not coalesced in effect: each one queued is answered.
        worker = _Worker("unskit-edge-validate", answer, quiet=0.0)

        def received(request: ipc_config.ValidationRequest) -> None:
            with lock:
                pending.append(request)
            worker.poke()

        try:
            stream = ipc_config.subscribe_to_validate_configuration_updates(
                self._ipc.connection(),
                received,
                _ended(worker, "deployments are no longer validated"),
            )
        except EdgeRuntimeError as exc:
            worker.close()
            raise _issue(str(exc), self.location) from None
        return _Watch([stream], worker)

    def _answer(self, request: ipc_config.ValidationRequest, validate: Validate) -> None:
        try:
            errors = validate(runtime_document(request.configuration))
        except Exception as exc:  # a checker that breaks must not leave the deployment waiting
            errors = [f"the configuration could not be checked: {type(exc).__name__}: {exc}"]
        message = "; ".join(errors) if errors else ""
        try:
            ipc_config.send_validity_report(
                self._ipc.connection(), request.deployment_id, errors is None, message
            )
        except EdgeRuntimeError as exc:
            _log.error(
                "edge runtime: deployment %s: the validity report was not taken: %s",
                request.deployment_id,
                exc,
            )
            return
        if errors is not None:
            _log.warning("edge runtime: deployment %s refused: %s", request.deployment_id, message)


class ComponentConfigProvider(_ConfigurationProvider):
    """CONFIG_COMPONENT: the document held in another component's configuration (say a
    configuration-only component deployed beside this one); a component the runtime does not
    have is a ConfigError naming it."""

    def __init__(self, component: str, environ: Mapping[str, str] | None = None) -> None:
        if not component:
            raise _issue("names no component", "CONFIG_COMPONENT", "-c/--config")
        super().__init__(component, environ)


def _merge_patch(old: Any, new: Mapping[str, Any]) -> dict[str, Any]:
    """The shadow update (a merge: a null deletes) that turns `old` into `new`."""
    patch: dict[str, Any] = {}
    previous = old if isinstance(old, Mapping) else {}
    for key in previous:
        if key not in new and key != STATUS_KEY:
            patch[key] = None
    for key, value in new.items():
        before = previous.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = _merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif before != value or key not in previous:
            patch[key] = value
    return patch


class ShadowProvider:
    """SHADOW: the document is the desired state of named shadow `name` of `thing`, applied
    on start and on every delta; `settle` writes what became of it (applied, or refused
    with its errors) back as the reported state.

    A delta holds only the changed keys, so each one re-reads the whole desired state
    (GetThingShadow); every reported update re-sends the delta, so a desired state already
    handled is skipped."""

    def __init__(self, thing: str, name: str, environ: Mapping[str, str] | None = None) -> None:
        self.thing = thing
        self.name = name
        self._ipc = _Connected(environ)
        self._lock = threading.Lock()
        self._version: int | None = None  # the shadow version last handed out
        self._desired_out: dict[str, Any] | None = None  # the desired state last handed out
        # The desired state last settled: a reported update bumps the shadow's version and
        # re-sends the delta, so it is the document, not the version, that tells a repeat.
        self._handled: dict[str, Any] | None = None

    @property
    def location(self) -> str:
        """The shadow and its resource, for messages."""
        return (
            f"shadow {self.name!r} of thing {self.thing!r} "
            f"({ipc_shadow.shadow_resource(self.thing, self.name)})"
        )

    @property
    def delta_topic(self) -> str:
        return ipc_shadow.delta_topic(self.thing, self.name)

    def _shadow(self, deadline: float) -> dict[str, Any] | None:
        """GetThingShadow, retried until `deadline` while the shadow manager is not up yet."""
        while True:
            try:
                return ipc_shadow.get_thing_shadow(self._ipc.connection(), self.thing, self.name)
            except AccessDeniedError as exc:
                raise _issue(str(exc), self.location) from None
            except EdgeRuntimeError as exc:
                if time.monotonic() >= deadline:
                    raise _issue(str(exc), self.location) from None
                _log.debug("edge runtime: %s not readable yet: %s", self.location, exc)
                time.sleep(0.1)  # backoff between attempts while the shadow manager starts

    def _desired(self, deadline: float) -> tuple[dict[str, Any], int | None]:
        document = self._shadow(deadline)
        if document is None:
            raise _issue(
                "the shadow does not exist: give it a desired state (the configuration "
                "document) first",
                self.location,
            )
        state = document.get("state")
        desired = state.get("desired") if isinstance(state, Mapping) else None
        if not isinstance(desired, Mapping):
            raise _issue(
                "has no desired state: its state.desired must be the configuration document",
                self.location,
            )
        version = document.get("version")
        return dict(desired), version if isinstance(version, int) else None

    def get_configuration(self) -> Mapping[str, Any]:
        """The whole desired state (waits up to `SHADOW_START_S` for the shadow manager)."""
        desired, version = self._desired(time.monotonic() + SHADOW_START_S)
        with self._lock:
            self._version, self._desired_out = version, desired
        return desired

    def settle(self, document: Mapping[str, Any], errors: list[str] | None) -> None:
        """Writes the outcome of the desired state last read as the reported state: applied
        (the reported state becomes the document, the delta clears) or refused with its
        errors (the reported state keeps the running configuration). Never raises."""
        with self._lock:
            version = self._version
            self._handled = self._desired_out
        status: dict[str, Any] = {
            "status": "APPLIED" if errors is None else "REFUSED",
            "desiredVersion": version,
            # [] rather than null: a null in a shadow update deletes the key.
            "errors": [] if errors is None else errors,
        }
        try:
            connection = self._ipc.connection()
            if errors is None:
                current = ipc_shadow.get_thing_shadow(connection, self.thing, self.name) or {}
                state = current.get("state")
                reported = state.get("reported") if isinstance(state, Mapping) else None
                update = {**_merge_patch(reported, document), STATUS_KEY: status}
            else:
                update = {STATUS_KEY: status}
            ipc_shadow.update_thing_shadow(connection, self.thing, self.name, {"reported": update})
        except EdgeRuntimeError as exc:
            _log.error(
                "edge runtime: %s: the reported state was not written: %s", self.location, exc
            )

    def subscribe(self, on_update: OnDocument, on_error: OnError) -> _Watch:
        """Follows the delta topic: calls `on_update` (on a worker thread) with the whole
        desired state of each new desired version; a delta that is not a JSON object is an
        error naming the shadow (nothing applied, still watching)."""
        received: list[bytes] = []
        lock = threading.Lock()

        def handle() -> None:
            with lock:
                payloads = received[:]
                received.clear()
            for payload in payloads:
                problem = self._bad_delta(payload)
                if problem is not None:
                    on_error(_issue(problem, self.location))
                    continue
                try:
                    desired, version = self._desired(time.monotonic() + SHADOW_START_S)
                except ConfigError as exc:
                    on_error(exc)
                    continue
                with self._lock:
                    if desired == self._handled:
                        continue  # e.g. the delta our own reported update re-sent
                    self._version, self._desired_out = version, desired
                on_update(desired)

        worker = _Worker("unskit-edge-shadow", handle, quiet=0.0)

        def message(payload: bytes) -> None:
            with lock:
                received.append(payload)
            worker.poke()

        try:
            stream = ipc_shadow.subscribe_to_topic(
                self._ipc.connection(),
                self.delta_topic,
                message,
                _ended(worker, f"{self.location} is no longer followed"),
            )
        except EdgeRuntimeError as exc:
            worker.close()
            raise _issue(str(exc), self.location) from None
        # A desired state set between the start's read and the subscription is not lost:
        # one re-read now (skipped when it is the one already handled).
        message(b'{"state": {}}')
        return _Watch([stream], worker)

    def _bad_delta(self, payload: bytes) -> str | None:
        where = f"a delta on {self.delta_topic}"
        try:
            delta = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return f"{where} is not JSON ({len(payload)} bytes); ignored, still watching"
        if not isinstance(delta, dict):
            return f"{where} is a {type(delta).__name__}, not an object; ignored, still watching"
        if not isinstance(delta.get("state"), dict):
            return f"{where} has no state object; ignored, still watching"
        return None

    def close(self) -> None:
        """Closes the IPC connection."""
        self._ipc.close()
