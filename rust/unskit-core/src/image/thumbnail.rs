//! Thumbnails: a raw frame or JPEG bytes to a small JPEG, aspect kept, area-averaged.

use jpeg_decoder::PixelFormat;
use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

use super::resize::{area_resize, fit_long_edge};
use super::turbo;
use crate::CoreError;

/// The quality a thumbnail is encoded at unless the caller asks otherwise.
pub const DEFAULT_QUALITY: u8 = 80;

/// The named thumbnail sizes; each bounds the long edge in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThumbnailSize {
    Small,
    Medium,
    Large,
}

impl ThumbnailSize {
    pub const ALL: [ThumbnailSize; 3] = [Self::Small, Self::Medium, Self::Large];

    pub fn long_edge(self) -> usize {
        match self {
            Self::Small => 160,
            Self::Medium => 320,
            Self::Large => 640,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
        }
    }

    pub fn from_name(name: &str) -> Result<Self, CoreError> {
        Self::ALL
            .into_iter()
            .find(|size| size.name() == name)
            .ok_or_else(|| {
                CoreError::InvalidImage(format!(
                    "unknown thumbnail size {name:?} (small, medium or large)"
                ))
            })
    }
}

/// How the bytes of one pixel are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelOrder {
    Gray,
    Rgb,
    Bgr,
}

impl PixelOrder {
    pub fn channels(self) -> usize {
        match self {
            Self::Gray => 1,
            Self::Rgb | Self::Bgr => 3,
        }
    }

    pub fn from_name(name: &str) -> Result<Self, CoreError> {
        match name {
            "gray" => Ok(Self::Gray),
            "rgb" => Ok(Self::Rgb),
            "bgr" => Ok(Self::Bgr),
            _ => Err(CoreError::InvalidImage(format!(
                "unknown pixel order {name:?} (gray, rgb or bgr)"
            ))),
        }
    }

    fn color_type(self) -> ColorType {
        match self {
            Self::Gray => ColorType::Luma,
            Self::Rgb => ColorType::Rgb,
            Self::Bgr => ColorType::Bgr,
        }
    }
}

/// A raw frame: `height` rows of `width` pixels, tightly packed.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub pixels: &'a [u8],
    pub width: usize,
    pub height: usize,
    pub order: PixelOrder,
}

/// An encoded thumbnail and its dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thumbnail {
    pub jpeg: Vec<u8>,
    pub width: usize,
    pub height: usize,
}

// JPEG stores each edge in 16 bits.
const MAX_EDGE: usize = u16::MAX as usize;

fn check_quality(quality: u8) -> Result<(), CoreError> {
    if (1..=100).contains(&quality) {
        Ok(())
    } else {
        Err(CoreError::InvalidImage(format!(
            "quality {quality} is outside 1..=100"
        )))
    }
}

/// A JPEG thumbnail of a raw frame, its long edge at most `size`'s.
pub fn thumbnail_from_frame(
    frame: &Frame<'_>,
    size: ThumbnailSize,
    quality: u8,
) -> Result<Thumbnail, CoreError> {
    let (out_width, out_height) = thumbnail_dimensions(
        frame.width,
        frame.height,
        frame.order,
        frame.pixels.len(),
        size,
        quality,
    )?;
    encode_scaled(
        frame.pixels,
        (frame.width, frame.height),
        (out_width, out_height),
        frame.order,
        quality,
    )
}

/// Checks a thumbnail request for a frame of `len` bytes and returns the thumbnail's
/// dimensions; for callers that feed the frame to an `AreaResizer` in pieces.
pub fn thumbnail_dimensions(
    width: usize,
    height: usize,
    order: PixelOrder,
    len: usize,
    size: ThumbnailSize,
    quality: u8,
) -> Result<(usize, usize), CoreError> {
    check_quality(quality)?;
    if width == 0 || height == 0 || width > MAX_EDGE || height > MAX_EDGE {
        return Err(CoreError::InvalidImage(format!(
            "a {width}x{height} frame (each edge 1 to {MAX_EDGE})"
        )));
    }
    let channels = order.channels();
    if width * height * channels != len {
        return Err(CoreError::InvalidImage(format!(
            "{len} bytes do not hold a {width}x{height} frame of {channels} channel(s)"
        )));
    }
    Ok(fit_long_edge(width, height, size.long_edge()))
}

/// A JPEG thumbnail of JPEG bytes: decoded by libjpeg-turbo at the smallest DCT scale (1/8
/// to 1/1) that still covers the target, then area-averaged, so the result has the same
/// dimensions as a thumbnail of the full decoded frame.
///
/// A YCbCr or gray JPEG stays in its planes throughout: each plane is area-averaged to the
/// thumbnail's 4:2:0 planes and encoded from them, skipping the colour conversion and chroma
/// resampling a decode to RGB and a re-encode would do twice (area averaging is linear, so
/// this is the RGB average up to rounding). Other JPEGs take the packed-RGB route.
pub fn thumbnail_from_jpeg(
    jpeg: &[u8],
    size: ThumbnailSize,
    quality: u8,
) -> Result<Thumbnail, CoreError> {
    check_quality(quality)?;
    let Some(decoder) = turbo::Decoder::new(jpeg)? else {
        return thumbnail_from_unusual_jpeg(jpeg, size, quality);
    };
    let (out_width, out_height) = fit_long_edge(decoder.width, decoder.height, size.long_edge());
    let (scaled_width, scaled_height) = decoder.scaled_size(out_width, out_height);
    let gray = match decoder.colorspace {
        turbo::CS_GRAY => true,
        turbo::CS_YCBCR | turbo::CS_RGB => false,
        _ => return Err(CoreError::MalformedImage(
            "JPEG colour space CMYK/YCCK is not supported for thumbnails (8-bit gray or colour)"
                .into(),
        )),
    };
    let out_subsamp = if gray {
        turbo::SAMP_GRAY
    } else {
        turbo::SAMP_420
    };
    let out_sizes = turbo::Planes::sizes(out_width, out_height, out_subsamp)?;
    let planar = decoder.colorspace != turbo::CS_RGB
        && turbo::Planes::sizes(scaled_width, scaled_height, decoder.subsamp).is_ok_and(|sizes| {
            // Every plane must shrink (a 4:1:1 chroma plane may be narrower than 4:2:0's).
            sizes.len() == out_sizes.len()
                && sizes
                    .iter()
                    .zip(&out_sizes)
                    .all(|(&(w, h), &(tw, th))| w >= tw && h >= th)
        });
    if planar {
        let planes = decoder.decode_planes(scaled_width, scaled_height)?;
        let data = planes
            .data
            .into_iter()
            .zip(planes.sizes.iter().zip(&out_sizes))
            .map(|(plane, (&(w, h), &(tw, th)))| {
                if (w, h) == (tw, th) {
                    Ok(plane)
                } else {
                    area_resize(&plane, w, h, 1, tw, th)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let small = turbo::Planes {
            width: out_width,
            height: out_height,
            subsamp: out_subsamp,
            sizes: out_sizes,
            data,
        };
        let jpeg = turbo::encode_planes(&small, quality)?;
        return Ok(Thumbnail {
            jpeg,
            width: out_width,
            height: out_height,
        });
    }
    let (format, channels) = if gray {
        (turbo::PF_GRAY, 1)
    } else {
        (turbo::PF_RGB, 3)
    };
    let pixels = decoder.decode_packed(scaled_width, scaled_height, format)?;
    let small = if (scaled_width, scaled_height) == (out_width, out_height) {
        pixels
    } else {
        area_resize(
            &pixels,
            scaled_width,
            scaled_height,
            channels,
            out_width,
            out_height,
        )?
    };
    let jpeg = turbo::encode_packed(&small, out_width, out_height, format, quality)?;
    Ok(Thumbnail {
        jpeg,
        width: out_width,
        height: out_height,
    })
}

/// The JPEGs whose sampling layout libjpeg-turbo 2.x cannot name, through jpeg-decoder
/// (pure Rust, slower, any layout): what every JPEG thumbnail took before libjpeg-turbo.
fn thumbnail_from_unusual_jpeg(
    jpeg: &[u8],
    size: ThumbnailSize,
    quality: u8,
) -> Result<Thumbnail, CoreError> {
    let malformed = |e: jpeg_decoder::Error| CoreError::MalformedImage(format!("JPEG: {e}"));
    let mut decoder = jpeg_decoder::Decoder::new(jpeg);
    decoder.read_info().map_err(malformed)?;
    let info = decoder
        .info()
        .ok_or_else(|| CoreError::MalformedImage("JPEG: no frame header".into()))?;
    let (width, height) = (usize::from(info.width), usize::from(info.height));
    if width == 0 || height == 0 {
        return Err(CoreError::MalformedImage(format!(
            "JPEG: a {width}x{height} frame"
        )));
    }
    let order = match info.pixel_format {
        PixelFormat::L8 => PixelOrder::Gray,
        PixelFormat::RGB24 => PixelOrder::Rgb,
        other => {
            return Err(CoreError::MalformedImage(format!(
                "JPEG pixel format {other:?} is not supported for thumbnails (8-bit gray or colour)"
            )))
        }
    };
    let (out_width, out_height) = fit_long_edge(width, height, size.long_edge());
    // Both edges fit in u16: they are at most the JPEG's own.
    let (scaled_width, scaled_height) = decoder
        .scale(out_width as u16, out_height as u16)
        .map_err(malformed)?;
    let pixels = decoder.decode().map_err(malformed)?;
    let (scaled_width, scaled_height) = (usize::from(scaled_width), usize::from(scaled_height));
    if pixels.len() != scaled_width * scaled_height * order.channels() {
        return Err(CoreError::MalformedImage(
            "JPEG: decoded pixels do not fill the frame".into(),
        ));
    }
    // A scale that covers only one edge (the decoder picks by either) shrinks the other.
    let target = (out_width.min(scaled_width), out_height.min(scaled_height));
    encode_scaled(
        &pixels,
        (scaled_width, scaled_height),
        target,
        order,
        quality,
    )
}

fn encode_scaled(
    pixels: &[u8],
    (width, height): (usize, usize),
    (out_width, out_height): (usize, usize),
    order: PixelOrder,
    quality: u8,
) -> Result<Thumbnail, CoreError> {
    if (out_width, out_height) == (width, height) {
        return encode_jpeg(pixels, width, height, order, quality);
    }
    let small = area_resize(
        pixels,
        width,
        height,
        order.channels(),
        out_width,
        out_height,
    )?;
    encode_jpeg(&small, out_width, out_height, order, quality)
}

/// Encodes already-sized pixels as the thumbnail JPEG.
pub fn encode_jpeg(
    pixels: &[u8],
    width: usize,
    height: usize,
    order: PixelOrder,
    quality: u8,
) -> Result<Thumbnail, CoreError> {
    check_quality(quality)?;
    if width == 0 || height == 0 || width > MAX_EDGE || height > MAX_EDGE {
        return Err(CoreError::InvalidImage(format!(
            "a {width}x{height} thumbnail (each edge 1 to {MAX_EDGE})"
        )));
    }
    if pixels.len() != width * height * order.channels() {
        return Err(CoreError::InvalidImage(format!(
            "{} bytes do not hold a {width}x{height} thumbnail",
            pixels.len()
        )));
    }
    let mut jpeg = Vec::with_capacity(width * height / 4 + 1024);
    let mut encoder = Encoder::new(&mut jpeg, quality);
    // 4:2:0 at every quality, as libjpeg does (the encoder switches to 4:4:4 from 90).
    // Chroma keeps the top-left sample of each 2x2: the frame is already area-averaged,
    // and box-averaging it again cost a quarter of the encode for no visible change.
    encoder.set_sampling_factor(SamplingFactor::F_2_2);
    encoder
        .encode(pixels, width as u16, height as u16, order.color_type())
        .map_err(|e| CoreError::InvalidImage(format!("JPEG encode: {e}")))?;
    Ok(Thumbnail {
        jpeg,
        width,
        height,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: usize, height: usize, channels: usize) -> Vec<u8> {
        let mut pixels = Vec::with_capacity(width * height * channels);
        for y in 0..height {
            for x in 0..width {
                for c in 0..channels {
                    pixels.push(((x * 255 / width + y * 3 + c * 40) % 256) as u8);
                }
            }
        }
        pixels
    }

    fn decode(jpeg: &[u8]) -> (usize, usize, PixelFormat) {
        let mut decoder = jpeg_decoder::Decoder::new(jpeg);
        let pixels = decoder.decode().unwrap();
        let info = decoder.info().unwrap();
        assert_eq!(
            pixels.len(),
            usize::from(info.width) * usize::from(info.height) * info.pixel_format.pixel_bytes()
        );
        (
            usize::from(info.width),
            usize::from(info.height),
            info.pixel_format,
        )
    }

    #[test]
    fn each_size_bounds_the_long_edge_and_keeps_aspect() {
        let pixels = gradient(1280, 720, 3);
        for size in ThumbnailSize::ALL {
            let frame = Frame {
                pixels: &pixels,
                width: 1280,
                height: 720,
                order: PixelOrder::Bgr,
            };
            let thumb = thumbnail_from_frame(&frame, size, DEFAULT_QUALITY).unwrap();
            let long = size.long_edge();
            assert_eq!((thumb.width, thumb.height), (long, long * 9 / 16));
            assert_eq!(
                decode(&thumb.jpeg),
                (thumb.width, thumb.height, PixelFormat::RGB24)
            );
        }
    }

    #[test]
    fn gray_frames_stay_gray() {
        let pixels = gradient(300, 500, 1);
        let frame = Frame {
            pixels: &pixels,
            width: 300,
            height: 500,
            order: PixelOrder::Gray,
        };
        let thumb = thumbnail_from_frame(&frame, ThumbnailSize::Small, 80).unwrap();
        assert_eq!((thumb.width, thumb.height), (96, 160));
        assert_eq!(decode(&thumb.jpeg), (96, 160, PixelFormat::L8));
    }

    #[test]
    fn jpeg_input_gives_the_same_dimensions_as_the_raw_frame() {
        let pixels = gradient(1920, 1080, 3);
        let frame = Frame {
            pixels: &pixels,
            width: 1920,
            height: 1080,
            order: PixelOrder::Rgb,
        };
        let full = thumbnail_from_frame(&frame, ThumbnailSize::Large, 95).unwrap();
        // Re-encode at full size to get a big JPEG, then thumbnail it.
        let mut big = Vec::new();
        Encoder::new(&mut big, 90)
            .encode(&pixels, 1920, 1080, ColorType::Rgb)
            .unwrap();
        for size in ThumbnailSize::ALL {
            let thumb = thumbnail_from_jpeg(&big, size, 80).unwrap();
            let raw = thumbnail_from_frame(&frame, size, 80).unwrap();
            assert_eq!((thumb.width, thumb.height), (raw.width, raw.height));
        }
        assert_eq!((full.width, full.height), (640, 360));
    }

    #[test]
    fn bad_requests_are_errors_not_panics() {
        let pixels = gradient(10, 10, 3);
        let short = Frame {
            pixels: &pixels[1..],
            width: 10,
            height: 10,
            order: PixelOrder::Rgb,
        };
        assert!(matches!(
            thumbnail_from_frame(&short, ThumbnailSize::Small, 80),
            Err(CoreError::InvalidImage(_))
        ));
        let ok = Frame {
            pixels: &pixels,
            ..short
        };
        assert!(thumbnail_from_frame(&ok, ThumbnailSize::Small, 0).is_err());
        assert!(thumbnail_from_frame(&ok, ThumbnailSize::Small, 101).is_err());
        assert!(ThumbnailSize::from_name("huge").is_err());
        assert!(PixelOrder::from_name("rgba").is_err());
        for garbage in [&b""[..], b"not a jpeg", &[0xFF, 0xD8, 0xFF, 0xC0, 0, 5]] {
            assert!(matches!(
                thumbnail_from_jpeg(garbage, ThumbnailSize::Small, 80),
                Err(CoreError::MalformedImage(_))
            ));
        }
    }

    fn mean_difference(a: &[u8], b: &[u8]) -> f64 {
        assert_eq!(a.len(), b.len());
        let total: u64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| u64::from(x.abs_diff(y)))
            .sum();
        total as f64 / a.len() as f64
    }

    fn pixels_of(jpeg: &[u8]) -> Vec<u8> {
        jpeg_decoder::Decoder::new(jpeg).decode().unwrap()
    }

    #[test]
    fn every_input_subsampling_gives_the_area_average_of_the_frame() {
        // Smooth content: what JPEG keeps, so the thumbnail must match the exact average.
        let (width, height) = (1000, 600);
        let mut pixels = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                pixels.extend([
                    (40 + x * 170 / width) as u8,
                    (30 + y * 190 / height) as u8,
                    (20 + (x + y) * 200 / (width + height)) as u8,
                ]);
            }
        }
        for size in ThumbnailSize::ALL {
            let (out_width, out_height) = fit_long_edge(width, height, size.long_edge());
            let exact = area_resize(&pixels, width, height, 3, out_width, out_height).unwrap();
            for factor in [
                SamplingFactor::F_1_1,
                SamplingFactor::F_2_1,
                SamplingFactor::F_1_2,
                SamplingFactor::F_2_2,
                SamplingFactor::F_4_1,
                // 4:1:0, which libjpeg-turbo 2.x cannot name: the jpeg-decoder route.
                SamplingFactor::F_4_2,
            ] {
                let mut big = Vec::new();
                let mut encoder = Encoder::new(&mut big, 95);
                encoder.set_sampling_factor(factor);
                encoder
                    .encode(&pixels, width as u16, height as u16, ColorType::Rgb)
                    .unwrap();
                let named = turbo::Decoder::new(&big).unwrap().is_some();
                assert_eq!(named, factor != SamplingFactor::F_4_2, "{factor:?}");
                let thumb = thumbnail_from_jpeg(&big, size, 95).unwrap();
                assert_eq!((thumb.width, thumb.height), (out_width, out_height));
                let diff = mean_difference(&pixels_of(&thumb.jpeg), &exact);
                assert!(diff < 2.0, "{factor:?} {size:?}: mean difference {diff}");
            }
        }
    }

    #[test]
    fn gray_jpegs_give_gray_thumbnails() {
        let pixels = gradient(640, 480, 1);
        let mut big = Vec::new();
        Encoder::new(&mut big, 90)
            .encode(&pixels, 640, 480, ColorType::Luma)
            .unwrap();
        let thumb = thumbnail_from_jpeg(&big, ThumbnailSize::Small, 80).unwrap();
        assert_eq!(decode(&thumb.jpeg), (160, 120, PixelFormat::L8));
    }

    #[test]
    fn cmyk_jpegs_are_refused_by_name() {
        let pixels = [10u8, 20, 30, 40].repeat(64 * 48);
        // Whole-resolution channels (libjpeg-turbo's route) and subsampled (jpeg-decoder's).
        for (color, factor) in [
            (ColorType::Cmyk, SamplingFactor::F_1_1),
            (ColorType::CmykAsYcck, SamplingFactor::F_1_1),
            (ColorType::Cmyk, SamplingFactor::F_2_2),
            (ColorType::CmykAsYcck, SamplingFactor::F_2_2),
        ] {
            let mut jpeg = Vec::new();
            let mut encoder = Encoder::new(&mut jpeg, 80);
            encoder.set_sampling_factor(factor);
            encoder.encode(&pixels, 64, 48, color).unwrap();
            match thumbnail_from_jpeg(&jpeg, ThumbnailSize::Small, 80) {
                Err(CoreError::MalformedImage(message)) => {
                    assert!(message.contains("CMYK"), "{message}")
                }
                other => panic!("a {color:?} JPEG gave {other:?}"),
            }
        }
    }

    #[test]
    fn corrupt_and_truncated_scans_are_malformed_but_stray_bytes_are_not() {
        let pixels = gradient(320, 240, 3);
        let mut jpeg = Vec::new();
        Encoder::new(&mut jpeg, 80)
            .encode(&pixels, 320, 240, ColorType::Rgb)
            .unwrap();
        let truncated = &jpeg[..jpeg.len() / 2];
        match thumbnail_from_jpeg(truncated, ThumbnailSize::Small, 80) {
            Err(CoreError::MalformedImage(message)) => {
                assert!(message.starts_with("JPEG: "), "{message}")
            }
            other => panic!("a truncated JPEG gave {other:?}"),
        }
        // A restart of the header in the middle of the scan data.
        let mut corrupt = jpeg.clone();
        let middle = corrupt.len() / 2;
        corrupt[middle..middle + 4].copy_from_slice(&[0xFF, 0xD8, 0xFF, 0xC0]);
        assert!(matches!(
            thumbnail_from_jpeg(&corrupt, ThumbnailSize::Small, 80),
            Err(CoreError::MalformedImage(_))
        ));
        // Stray bytes before a marker: the image is whole.
        let mut stray = jpeg[..2].to_vec();
        stray.extend_from_slice(&[0, 0, 0]);
        stray.extend_from_slice(&jpeg[2..]);
        let thumb = thumbnail_from_jpeg(&stray, ThumbnailSize::Small, 80).unwrap();
        assert_eq!((thumb.width, thumb.height), (160, 120));
    }

    #[test]
    fn truncated_jpeg_never_panics() {
        let pixels = gradient(64, 48, 3);
        let mut jpeg = Vec::new();
        Encoder::new(&mut jpeg, 80)
            .encode(&pixels, 64, 48, ColorType::Rgb)
            .unwrap();
        for cut in (0..jpeg.len()).step_by(7) {
            let _ = thumbnail_from_jpeg(&jpeg[..cut], ThumbnailSize::Small, 80);
        }
    }
}
