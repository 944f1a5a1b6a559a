"""Reference area-average resize in pure Python: the exact integer definition.

Output pixel (x, y) covers source columns [x*W/w, (x+1)*W/w) and rows [y*H/h, (y+1)*H/h);
each source pixel counts with the area it shares with that box, in units of 1/w by 1/h of a
pixel, and the weighted sum over W*H is rounded half up.
"""

from __future__ import annotations

__all__ = ["area_resize", "fit_long_edge"]


def fit_long_edge(width: int, height: int, long_edge: int) -> tuple[int, int]:
    """Dimensions with the long edge at most `long_edge`, aspect kept, never enlarged."""
    long = max(width, height)
    if long <= long_edge:
        return width, height
    short = min(width, height)
    scaled = max(1, (2 * short * long_edge + long) // (2 * long))
    return (long_edge, scaled) if width >= height else (scaled, long_edge)


def _weights(source: int, target: int, index: int) -> list[tuple[int, int]]:
    lo, hi = index * source, (index + 1) * source
    return [
        (i, min(hi, (i + 1) * target) - max(lo, i * target))
        for i in range(lo // target, (hi - 1) // target + 1)
    ]


def area_resize(
    src: bytes, width: int, height: int, channels: int, out_width: int, out_height: int
) -> bytes:
    """Area-average downscale of interleaved 8-bit pixels to `out_width` x `out_height`."""
    if len(src) != width * height * channels:
        raise ValueError("buffer length does not match the shape")
    if not (0 < out_width <= width and 0 < out_height <= height):
        raise ValueError("area resize only shrinks")
    denominator = width * height
    columns = [_weights(width, out_width, x) for x in range(out_width)]
    out = bytearray()
    for y in range(out_height):
        rows = _weights(height, out_height, y)
        for x in range(out_width):
            for c in range(channels):
                total = sum(
                    wy * wx * src[(sy * width + sx) * channels + c]
                    for sy, wy in rows
                    for sx, wx in columns[x]
                )
                out.append((2 * total + denominator) // (2 * denominator))
    return bytes(out)
