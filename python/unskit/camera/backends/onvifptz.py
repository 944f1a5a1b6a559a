"""The `onvif` backend's PTZ head: the PTZ service of the camera's media profile as a
backend-neutral head (status, continuous, absolute and relative moves, stop, presets), the
normalized axes mapped one to one onto ONVIF's generic spaces, and what it knows of the head's
motion from the commands it sent and the last status it read. Every exchange runs over the
backend's link, serialized per camera; it imports no SOAP library itself."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from unskit.camera.backends import AXES, Preset, PtzStatus
from unskit.camera.backends.onvifsoap import _T, _text, soap_call
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError, SoapDeviceError

if TYPE_CHECKING:
    from unskit.camera.backends.onvif import OnvifBackend, _Link

__all__ = ["OnvifPtzHead"]

# The logger keeps the name it had before this module was split out of onvif.py.
_log = logging.getLogger("unskit.camera.backends.onvif")


def _vector(values: Mapping[str, float], fill: Mapping[str, float]) -> dict[str, Any]:
    """An ONVIF PTZVector or PTZSpeed from normalized axes: PanTilt carries pan and tilt
    together, so a missing one of the pair comes from `fill`."""
    vector: dict[str, Any] = {}
    if "pan" in values or "tilt" in values:
        vector["PanTilt"] = {
            "x": values.get("pan", fill.get("pan", 0.0)),
            "y": values.get("tilt", fill.get("tilt", 0.0)),
        }
    if "zoom" in values:
        vector["Zoom"] = {"x": values["zoom"]}
    return vector


class OnvifPtzHead:
    """The PTZ service of the camera's media profile, as a backend-neutral head."""

    def __init__(self, backend: OnvifBackend) -> None:
        self._backend = backend
        self._known = threading.Lock()
        # Axes this adapter set moving continuously, and the last GetStatus's motion (reset
        # by every command): what known_moving answers without asking the camera.
        self._continuous: set[str] = set()
        self._observed: bool | None = None

    def known_moving(self) -> bool:
        """Whether the head moves, from the commands sent and the last status observed."""
        with self._known:
            return bool(self._continuous) or bool(self._observed)

    def _commanded(self, continuous: set[str] | None = None, stopped: tuple[str, ...] = ()) -> None:
        with self._known:
            self._observed = None
            if continuous is None:
                self._continuous.difference_update(stopped or AXES)
            else:
                self._continuous.difference_update(stopped)
                self._continuous |= continuous

    def _ptz(self, what: str, action: Callable[[Any, str], _T]) -> _T:
        def run(link: _Link) -> _T:
            if link.ptz is None:
                raise SoapDeviceError(
                    ErrorCode.UNSUPPORTED_CAPABILITY,
                    f"{self._backend.where} has no PTZ service for profile {link.profile!r}",
                    retriable=False,
                )
            return soap_call(self._backend.where, what, lambda: action(link.ptz, link.profile))

        return self._backend.call(what, run)

    def _position(self, service: Any, profile: str) -> dict[str, float]:
        return self._position_of(service.GetStatus(ProfileToken=profile)) or {}

    def status(self) -> PtzStatus:
        """GetStatus; a device that does not answer is reported unavailable, not raised."""

        def ask(service: Any, profile: str) -> PtzStatus:
            status = service.GetStatus(ProfileToken=profile)
            position = self._position_of(status)
            move = getattr(status, "MoveStatus", None)
            states = [
                str(state)
                for state in (getattr(move, "PanTilt", None), getattr(move, "Zoom", None))
                if state is not None
            ]
            known = [state for state in states if state != "UNKNOWN"]
            moving = None if not known else any(state == "MOVING" for state in known)
            with self._known:
                self._observed = moving
                if moving is False:
                    self._continuous.clear()
            return PtzStatus(position, moving)

        try:
            return self._ptz("GetStatus", ask)
        except CommandError as error:
            _log.debug("ONVIF camera %s: no PTZ status: %s", self._backend.where, error)
            return PtzStatus(None, None, available=False)

    @staticmethod
    def _position_of(status: Any) -> dict[str, float] | None:
        position = getattr(status, "Position", None)
        if position is None:
            return None
        found: dict[str, float] = {}
        pan_tilt = getattr(position, "PanTilt", None)
        if pan_tilt is not None:
            found["pan"], found["tilt"] = float(pan_tilt.x), float(pan_tilt.y)
        zoom = getattr(position, "Zoom", None)
        if zoom is not None:
            found["zoom"] = float(zoom.x)
        return found or None

    def continuous(self, velocity: Mapping[str, float]) -> None:
        """ContinuousMove without a device timeout (the adapter arms the stop)."""
        self._ptz(
            "ContinuousMove",
            lambda service, profile: service.ContinuousMove(
                ProfileToken=profile, Velocity=_vector(velocity, {})
            ),
        )
        self._commanded(
            continuous={axis for axis, value in velocity.items() if value},
            stopped=tuple(axis for axis, value in velocity.items() if not value),
        )

    def absolute(self, position: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """AbsoluteMove; a lone pan or tilt keeps the other where it is."""

        def move(service: Any, profile: str) -> Any:
            fill = (
                self._position(service, profile)
                if len(position.keys() & {"pan", "tilt"}) == 1
                else {}
            )
            arguments: dict[str, Any] = {
                "ProfileToken": profile,
                "Position": _vector(position, fill),
            }
            if speed:
                arguments["Speed"] = _vector(speed, {"pan": 1.0, "tilt": 1.0})
            return service.AbsoluteMove(**arguments)

        self._ptz("AbsoluteMove", move)
        self._commanded(stopped=tuple(position))

    def relative(self, translation: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """RelativeMove; a missing axis of a pair moves by 0."""

        def move(service: Any, profile: str) -> Any:
            arguments: dict[str, Any] = {
                "ProfileToken": profile,
                "Translation": _vector(translation, {}),
            }
            if speed:
                arguments["Speed"] = _vector(speed, {"pan": 1.0, "tilt": 1.0})
            return service.RelativeMove(**arguments)

        self._ptz("RelativeMove", move)
        self._commanded(stopped=tuple(translation))

    def stop(self, axes: tuple[str, ...]) -> None:
        """Stop: pan or tilt stops the PanTilt pair (ONVIF stops them together)."""
        pan_tilt = "pan" in axes or "tilt" in axes
        self._ptz(
            "Stop",
            lambda service, profile: service.Stop(
                ProfileToken=profile, PanTilt=pan_tilt, Zoom="zoom" in axes
            ),
        )
        self._commanded(stopped=("pan", "tilt", *axes) if pan_tilt else axes)

    def presets(self) -> list[Preset]:
        """GetPresets, in the device's order."""

        def ask(service: Any, profile: str) -> list[Preset]:
            found = service.GetPresets(ProfileToken=profile) or []
            return [Preset(str(p.token), _text(getattr(p, "Name", None))) for p in found]

        return self._ptz("GetPresets", ask)

    def goto_preset(self, token: str) -> None:
        """GotoPreset."""
        self._ptz(
            "GotoPreset",
            lambda service, profile: service.GotoPreset(ProfileToken=profile, PresetToken=token),
        )
        self._commanded(stopped=AXES)

    def set_preset(self, name: str) -> str:
        """SetPreset of a new preset; the device issues the token."""
        return self._ptz(
            "SetPreset",
            lambda service, profile: str(service.SetPreset(ProfileToken=profile, PresetName=name)),
        )

    def remove_preset(self, token: str) -> None:
        """RemovePreset."""
        self._ptz(
            "RemovePreset",
            lambda service, profile: service.RemovePreset(ProfileToken=profile, PresetToken=token),
        )
