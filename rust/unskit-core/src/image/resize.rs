//! Exact area-average downscaling of interleaved 8-bit pixels.
//!
//! Output pixel (x, y) averages the source over the box [x*W/w, (x+1)*W/w) by
//! [y*H/h, (y+1)*H/h), each source pixel weighted by the area it shares with the box (what
//! OpenCV's INTER_AREA does). The weights are integers in units of 1/w by 1/h of a source
//! pixel, so the result is exact, rounded half up, and a pure-Python twin can match it bit
//! for bit (`unskit._reference.image.area_resize`).

use crate::CoreError;

/// Output dimensions with the long edge at most `long_edge`, keeping the aspect ratio
/// (short edge rounded half up, at least 1). A frame already that small keeps its size.
pub fn fit_long_edge(width: usize, height: usize, long_edge: usize) -> (usize, usize) {
    let long = width.max(height);
    if long <= long_edge || long == 0 {
        return (width, height);
    }
    let scale = |short: usize| ((2 * short * long_edge + long) / (2 * long)).max(1);
    if width >= height {
        (long_edge, scale(height))
    } else {
        (scale(width), long_edge)
    }
}

/// The source span feeding each output index: first source index and integer weights.
struct Taps {
    first: Vec<usize>,
    offsets: Vec<usize>,
    weights: Vec<u32>,
}

impl Taps {
    fn new(source: usize, target: usize) -> Taps {
        let mut first = Vec::with_capacity(target);
        let mut offsets = Vec::with_capacity(target + 1);
        let mut weights = Vec::new();
        offsets.push(0);
        for o in 0..target {
            // In units of 1/target of a source pixel, output o covers [o*source, (o+1)*source).
            let (lo, hi) = (o * source, (o + 1) * source);
            let start = lo / target;
            let end = (hi - 1) / target;
            first.push(start);
            for i in start..=end {
                let overlap = hi.min((i + 1) * target) - lo.max(i * target);
                weights.push(overlap as u32);
            }
            offsets.push(weights.len());
        }
        Taps {
            first,
            offsets,
            weights,
        }
    }

    fn of(&self, o: usize) -> (usize, &[u32]) {
        (
            self.first[o],
            &self.weights[self.offsets[o]..self.offsets[o + 1]],
        )
    }
}

/// Area-average downscale of `src` (`height` rows of `width` pixels of `channels` bytes)
/// to `out_width` x `out_height`; neither output edge may exceed the source's.
pub fn area_resize(
    src: &[u8],
    width: usize,
    height: usize,
    channels: usize,
    out_width: usize,
    out_height: usize,
) -> Result<Vec<u8>, CoreError> {
    if width == 0 || height == 0 || out_width == 0 || out_height == 0 {
        return Err(CoreError::InvalidImage(format!(
            "cannot resize {width}x{height} to {out_width}x{out_height}: empty edge"
        )));
    }
    if out_width > width || out_height > height {
        return Err(CoreError::InvalidImage(format!(
            "area resize only shrinks: {width}x{height} to {out_width}x{out_height}"
        )));
    }
    if !(1..=4).contains(&channels) {
        return Err(CoreError::InvalidImage(format!(
            "{channels} channels (1 to 4 supported)"
        )));
    }
    let expected = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(channels));
    if expected != Some(src.len()) {
        return Err(CoreError::InvalidImage(format!(
            "{} bytes do not hold {width}x{height} pixels of {channels} channel(s)",
            src.len()
        )));
    }
    Ok(match channels {
        1 => resize_with::<1>(src, width, height, out_width, out_height),
        2 => resize_with::<2>(src, width, height, out_width, out_height),
        3 => resize_with::<3>(src, width, height, out_width, out_height),
        _ => resize_with::<4>(src, width, height, out_width, out_height),
    })
}

/// `round_half_up(numerator / denominator)` for the exact weighted sums, without one
/// hardware division per output byte: a float estimate corrected by at most a step.
struct Divider {
    twice: u64,
    inverse: f64,
}

impl Divider {
    fn new(denominator: u64) -> Divider {
        Divider {
            twice: 2 * denominator,
            inverse: 1.0 / (2 * denominator) as f64,
        }
    }

    #[inline(always)]
    fn round(&self, sum: u64) -> u8 {
        let n = 2 * sum + self.twice / 2;
        let mut q = (n as f64 * self.inverse) as u64;
        if q * self.twice > n {
            q -= 1;
        } else if (q + 1) * self.twice <= n {
            q += 1;
        }
        q as u8
    }
}

fn resize_with<const C: usize>(
    src: &[u8],
    width: usize,
    height: usize,
    out_width: usize,
    out_height: usize,
) -> Vec<u8> {
    let rows = Taps::new(height, out_height);
    let cols = Taps::new(width, out_width);
    let row_len = width * C;
    // Vertical weights of one output row sum to `height`, so a column sum is at most
    // 255 * height (< 2^32 for any JPEG-sized frame); the horizontal sums need 64 bits.
    let mut column = vec![0u32; row_len];
    let divider = Divider::new(width as u64 * height as u64);
    let mut out = vec![0u8; out_width * out_height * C];
    for (oy, out_row) in out.chunks_exact_mut(out_width * C).enumerate() {
        let (first, weights) = rows.of(oy);
        column.fill(0);
        for (k, &w) in weights.iter().enumerate() {
            let row = &src[(first + k) * row_len..][..row_len];
            for (acc, &p) in column.iter_mut().zip(row) {
                *acc += w * u32::from(p);
            }
        }
        for (ox, pixel) in out_row.chunks_exact_mut(C).enumerate() {
            let (first, weights) = cols.of(ox);
            let mut sums = [0u64; C];
            let span = &column[first * C..][..weights.len() * C];
            for (&w, source) in weights.iter().zip(span.chunks_exact(C)) {
                for c in 0..C {
                    sums[c] += u64::from(w) * u64::from(source[c]);
                }
            }
            for c in 0..C {
                pixel[c] = divider.round(sums[c]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_aspect_and_never_upscales() {
        assert_eq!(fit_long_edge(1920, 1080, 320), (320, 180));
        assert_eq!(fit_long_edge(1080, 1920, 320), (180, 320));
        assert_eq!(fit_long_edge(100, 50, 320), (100, 50));
        assert_eq!(fit_long_edge(10_000, 1, 160), (160, 1));
        assert_eq!(fit_long_edge(641, 481, 640), (640, 480));
    }

    #[test]
    fn integer_ratio_is_the_block_mean_rounded_half_up() {
        // 4x2 gray to 2x1: blocks {0,1,4,5} and {2,3,6,7} of values 0..8.
        let src: Vec<u8> = vec![0, 1, 2, 3, 4, 5, 6, 7];
        // means 2.5 -> 3 and 4.5 -> 5 (half up)
        assert_eq!(area_resize(&src, 4, 2, 1, 2, 1).unwrap(), vec![3, 5]);
    }

    #[test]
    fn fractional_ratio_weights_by_shared_area() {
        // 3 pixels to 2: output 0 = (2*a + 1*b)/3, output 1 = (1*b + 2*c)/3.
        let src = [0u8, 90, 255];
        let out = area_resize(&src, 3, 1, 1, 2, 1).unwrap();
        assert_eq!(out, vec![30, 200]);
    }

    #[test]
    fn constant_frame_stays_constant_and_channels_stay_apart() {
        let src: Vec<u8> = [10u8, 20, 30].repeat(37 * 23);
        let out = area_resize(&src, 37, 23, 3, 11, 5).unwrap();
        assert_eq!(out, [10u8, 20, 30].repeat(11 * 5));
    }

    #[test]
    fn same_size_is_identity() {
        let src: Vec<u8> = (0..60u8).collect();
        assert_eq!(area_resize(&src, 5, 4, 3, 5, 4).unwrap(), src);
    }

    #[test]
    fn refuses_wrong_length_upscale_and_empty() {
        assert!(matches!(
            area_resize(&[0; 11], 4, 3, 1, 2, 2),
            Err(CoreError::InvalidImage(_))
        ));
        assert!(area_resize(&[0; 12], 4, 3, 1, 5, 2).is_err());
        assert!(area_resize(&[], 0, 3, 1, 0, 2).is_err());
    }
}
