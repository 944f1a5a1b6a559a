"""Thumbnails through the bindings: exact resize parity, sizes, orders, JPEG input, errors."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit import ImageError, Thumbnail, make_thumbnail, thumbnail_from_jpeg
from unskit._core import image as core
from unskit._reference import image as ref
from unskit.thumbnails import THUMBNAIL_SIZES


def frame(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (height, width, channels) if channels > 1 else (height, width)
    noise = rng.integers(0, 256, shape, dtype=np.uint8)
    return cv2.GaussianBlur(noise, (9, 9), 3)


def decoded(thumb: Thumbnail, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(thumb.data, np.uint8), flags)
    assert image is not None, "not a JPEG"
    return image


@settings(max_examples=80, deadline=None)
@given(
    width=st.integers(1, 24),
    height=st.integers(1, 24),
    channels=st.sampled_from([1, 3, 4]),
    data=st.data(),
)
def test_resize_agrees_exactly_with_the_reference(width, height, channels, data):
    out_width = data.draw(st.integers(1, width))
    out_height = data.draw(st.integers(1, height))
    length = width * height * channels
    pixels = data.draw(st.binary(min_size=length, max_size=length))
    ours = core.area_resize(pixels, width, height, channels, out_width, out_height)
    assert ours == ref.area_resize(pixels, width, height, channels, out_width, out_height)


def test_resize_is_close_to_opencv_inter_area():
    image = frame(96, 160, seed=3)
    ours = np.frombuffer(core.area_resize(image, 160, 96, 3, 48, 29), np.uint8).reshape(29, 48, 3)
    theirs = cv2.resize(image, (48, 29), interpolation=cv2.INTER_AREA)
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1


@pytest.mark.parametrize(("size", "long_edge"), [("small", 160), ("medium", 320), ("large", 640)])
@pytest.mark.parametrize(("height", "width"), [(1080, 1920), (1920, 1080), (700, 700)])
def test_each_size_bounds_the_long_edge_and_keeps_aspect(size, long_edge, height, width):
    assert THUMBNAIL_SIZES[size] == long_edge
    thumb = make_thumbnail(frame(height, width), size)
    assert max(thumb.width, thumb.height) == long_edge
    assert thumb.width / thumb.height == pytest.approx(width / height, rel=0.01)
    assert decoded(thumb).shape == (thumb.height, thumb.width, 3)
    assert thumb.to_body() == {
        "encoding": "jpeg",
        "width": thumb.width,
        "height": thumb.height,
        "bytes": len(thumb.data),
        "data": thumb.data,
    }


def test_a_small_frame_is_not_enlarged():
    thumb = make_thumbnail(frame(90, 120), "large")
    assert (thumb.width, thumb.height) == (120, 90)


def test_bgr_and_rgb_orders_put_colours_where_they_belong():
    bgr = np.zeros((200, 300, 3), np.uint8)
    bgr[..., 0] = 255  # pure blue in OpenCV's BGR order
    from_bgr = decoded(make_thumbnail(bgr, "small", order="bgr"))
    from_rgb = decoded(make_thumbnail(bgr, "small", order="rgb"))
    # OpenCV decodes to BGR: blue stays in channel 0; the same bytes read as RGB are red.
    assert from_bgr[..., 0].mean() > 200
    assert from_bgr[..., 2].mean() < 50
    assert from_rgb[..., 2].mean() > 200
    assert from_rgb[..., 0].mean() < 50


def test_gray_frames_give_gray_jpegs():
    thumb = make_thumbnail(frame(480, 640, channels=1), "small")
    assert (thumb.width, thumb.height) == (160, 120)
    assert decoded(thumb).shape == (120, 160)


def test_flat_buffers_with_explicit_shape():
    image = frame(120, 200, seed=5)
    by_shape = make_thumbnail(image, "small")
    flat = make_thumbnail(image.tobytes(), "small", width=200, height=120, order="bgr")
    inferred = make_thumbnail(bytearray(image.tobytes()), "small", width=200, height=120)
    assert by_shape == flat == inferred
    gray = frame(120, 200, channels=1)
    assert make_thumbnail(gray.tobytes(), "small", width=200, height=120).height == 96


def test_a_cropped_view_is_thumbnailed_as_its_pixels():
    image = frame(400, 600, seed=9)
    crop = image[50:350, 100:500]
    assert make_thumbnail(crop, "small") == make_thumbnail(np.ascontiguousarray(crop), "small")


def test_quality_changes_the_size():
    image = frame(720, 1280, seed=2)
    assert len(make_thumbnail(image, "large", quality=95).data) > len(
        make_thumbnail(image, "large", quality=30).data
    )


def test_output_size_is_close_to_opencv_at_equal_quality():
    image = frame(1080, 1920, seed=4)
    ours = make_thumbnail(image, "medium", quality=80)
    small = cv2.resize(image, (ours.width, ours.height), interpolation=cv2.INTER_AREA)
    theirs = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 80])[1]
    assert abs(len(ours.data) - len(theirs)) <= 0.1 * len(theirs)


@pytest.mark.parametrize("size", ["small", "medium", "large"])
@pytest.mark.parametrize("channels", [1, 3])
def test_from_jpeg_matches_the_raw_dimensions_and_content(size, channels):
    image = frame(1080, 1920, channels=channels, seed=6)
    jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 92])[1].tobytes()
    from_jpeg = thumbnail_from_jpeg(jpeg, size)
    from_raw = make_thumbnail(image, size)
    assert (from_jpeg.width, from_jpeg.height) == (from_raw.width, from_raw.height)
    a, b = decoded(from_jpeg).astype(int), decoded(from_raw).astype(int)
    assert a.shape == b.shape
    assert np.abs(a - b).mean() < 4


def test_from_jpeg_accepts_any_buffer():
    jpeg = cv2.imencode(".jpg", frame(100, 150))[1]
    assert thumbnail_from_jpeg(jpeg) == thumbnail_from_jpeg(jpeg.tobytes())
    assert thumbnail_from_jpeg(bytearray(jpeg.tobytes())).width == 150


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: make_thumbnail(b"\0" * 100, width=10, height=11), "neither"),
        (lambda: make_thumbnail(b"\0" * 299, width=10, height=10, order="rgb"), "299 bytes"),
        (lambda: make_thumbnail(np.zeros((10, 10, 3), np.uint8), "huge"), "unknown thumbnail size"),
        (lambda: make_thumbnail(np.zeros((10, 10, 3), np.uint8), order="rgba"), "pixel order"),
        (lambda: make_thumbnail(np.zeros((10, 10, 4), np.uint8)), "channel"),
        (lambda: make_thumbnail(np.zeros((10, 10), np.uint16)), "8-bit"),
        (lambda: make_thumbnail(np.zeros((10, 10, 3), np.uint8), quality=0), "quality"),
        (lambda: make_thumbnail(np.zeros((10, 10, 3), np.uint8), quality=101), "quality"),
        (lambda: make_thumbnail(np.zeros((10, 10, 3), np.uint8), width=11), "disagree"),
        (lambda: make_thumbnail(np.zeros((0, 10, 3), np.uint8)), "0"),
        (lambda: make_thumbnail(b"\0" * 10), "width= and height="),
        (lambda: thumbnail_from_jpeg(b"not a jpeg at all"), "malformed image"),
        (lambda: thumbnail_from_jpeg(b""), "malformed image"),
        (lambda: thumbnail_from_jpeg(b"\xff\xd8\xff\xdb" + b"\0" * 60), "malformed image"),
        (lambda: thumbnail_from_jpeg(cv2.imencode(".jpg", frame(64, 64))[1], "tiny"), "size"),
    ],
)
def test_bad_input_raises_image_error(call, message):
    with pytest.raises(ImageError, match=message):
        call()
    assert issubclass(ImageError, ValueError)


def test_truncated_jpegs_raise_or_decode_never_crash():
    jpeg = cv2.imencode(".jpg", frame(120, 160))[1].tobytes()
    for cut in range(0, len(jpeg), 97):
        try:
            thumb = thumbnail_from_jpeg(jpeg[:cut])
        except ImageError:
            continue
        assert thumb.width == 160


def test_a_corrupt_or_truncated_1080p_jpeg_raises_image_error_naming_the_damage():
    jpeg = cv2.imencode(".jpg", frame(1080, 1920, seed=5), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
    data = jpeg.tobytes()
    with pytest.raises(ImageError, match="malformed image: JPEG: Premature end"):
        thumbnail_from_jpeg(data[: len(data) // 2], "medium")
    # A second start-of-frame marker inside the scan data.
    middle = len(data) // 2
    corrupt = data[:middle] + b"\xff\xd8\xff\xc0" + data[middle + 4 :]
    with pytest.raises(ImageError, match="malformed image: JPEG: "):
        thumbnail_from_jpeg(corrupt, "medium")
    # Stray bytes between segments leave the image whole: it still thumbnails.
    stray = data[:2] + b"\0\0\0" + data[2:]
    assert thumbnail_from_jpeg(stray, "medium") == thumbnail_from_jpeg(data, "medium")


@pytest.mark.parametrize(
    ("width", "height", "channels", "out_width", "out_height"),
    [
        (96, 54, 3, 64, 36),  # 1.5x, a quarter-scale JPEG decode to its thumbnail
        (120, 90, 3, 20, 15),  # 6x, whole blocks
        (77, 41, 1, 13, 7),  # no common factor
        (3, 600, 1, 2, 1),  # a run of 600 full rows: past the 16-bit sums
    ],
)
def test_resize_agrees_with_the_reference_at_thumbnail_ratios(
    width, height, channels, out_width, out_height
):
    shape = (height, width, channels)
    pixels = np.random.default_rng(width).integers(0, 256, shape, dtype=np.uint8).tobytes()
    ours = core.area_resize(pixels, width, height, channels, out_width, out_height)
    assert ours == ref.area_resize(pixels, width, height, channels, out_width, out_height)
