"""Twin of `rust/unskit-core/src/signal`: scaling and the deadband change gate."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RefConfig:
    scale: float | None = None
    offset: float | None = None
    deadband: str = "none"
    value: float = 0.0
    always: bool = False


def scale(cfg: RefConfig, raw: float) -> float:
    if cfg.scale is None and cfg.offset is None:
        return raw
    s = 1.0 if cfg.scale is None else cfg.scale
    o = 0.0 if cfg.offset is None else cfg.offset
    return raw * s + o


def _transition(last: float, value: float) -> bool:
    return value != last and not (math.isnan(value) and math.isnan(last))


def passes(kind: str, threshold: float, last: float, value: float) -> bool:
    if kind == "none":
        return _transition(last, value)
    if not math.isfinite(value) or not math.isfinite(last):
        return _transition(last, value)
    if kind == "percent":
        if last == 0.0:
            return value != last
        threshold = abs(last) * threshold / 100.0
    return abs(value - last) >= threshold and value != last


class RefBank:
    def __init__(self, configs: list[RefConfig]) -> None:
        self.configs = configs
        self.last: list[float | None] = [None] * len(configs)

    def offer(self, index: int, raw: float) -> tuple[bool, float]:
        cfg = self.configs[index]
        value = scale(cfg, float(raw))
        last = self.last[index]
        ok = last is None or cfg.always or passes(cfg.deadband, cfg.value, last, value)
        if ok:
            self.last[index] = value
        return ok, value
