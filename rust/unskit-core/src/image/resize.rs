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

/// The source span feeding each output index, in units of 1/`target` of a source pixel:
/// an optional partly covered first pixel, `full` pixels of weight `target`, and an
/// optional partly covered last one. Splitting it so lets the hot loops add instead of
/// multiply: full pixels are summed plainly and scaled once.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// First source index covered at all.
    first: usize,
    /// Weight of `first` when partly covered (then the full run starts after it), else 0.
    head: u32,
    /// Number of fully covered pixels.
    full: usize,
    /// Weight of the pixel after the full run when partly covered, else 0.
    tail: u32,
}

impl Span {
    fn full_start(&self) -> usize {
        self.first + usize::from(self.head > 0)
    }
}

fn spans(source: usize, target: usize) -> Vec<Span> {
    (0..target)
        .map(|o| {
            let (lo, hi) = (o * source, (o + 1) * source);
            let first = lo / target;
            let head = if lo % target == 0 {
                0
            } else {
                // Output o starts inside pixel `first`; it may also end inside it.
                (hi.min((first + 1) * target) - lo) as u32
            };
            let full_from = if head > 0 { first + 1 } else { first };
            let full_to = hi / target; // pixels [full_from, full_to) are fully covered
            let full = full_to.saturating_sub(full_from);
            let tail = if hi % target != 0 && full_to >= full_from && (head == 0 || full_to > first)
            {
                (hi - full_to * target) as u32
            } else {
                0
            };
            Span {
                first,
                head,
                full,
                tail,
            }
        })
        .collect()
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

/// `round_half_up(sum / denominator)` for the exact weighted sums, without a hardware
/// division per output byte: `n / d` is estimated as the high half of `n * ceil(2^64 / d)`,
/// which is the quotient or one more (the error is below n / 2^64 < 1), then corrected.
struct Divider {
    twice: u64,
    reciprocal: u128,
}

impl Divider {
    fn new(denominator: u64) -> Divider {
        let twice = 2 * denominator;
        Divider {
            twice,
            reciprocal: (1u128 << 64) / u128::from(twice) + 1,
        }
    }

    #[inline(always)]
    fn round(&self, sum: u64) -> u8 {
        // floor((2 * sum + d) / (2 * d)) is sum / d rounded half up.
        let n = 2 * sum + self.twice / 2;
        let mut q = ((u128::from(n) * self.reciprocal) >> 64) as u64;
        if q * self.twice > n {
            q -= 1;
        }
        q as u8
    }
}

/// Rows of at most this many fully covered source pixels are summed in 16 bits
/// (255 * 257 = 65535), twice the lanes per vector instruction of 32 bits.
const NARROW_RUN: usize = 257;

fn resize_with<const C: usize>(
    src: &[u8],
    width: usize,
    height: usize,
    out_width: usize,
    out_height: usize,
) -> Vec<u8> {
    let rows = spans(height, out_height);
    let cols = spans(width, out_width);
    let col_unit = out_width as u64;
    let row_len = width * C;
    let row_unit = out_height as u32;
    // Per output row: the fully covered source rows are summed plainly (`narrow` in 16
    // bits, `plain` in 32 when the run is long) and scaled by `row_unit` once; the partly
    // covered ones are weighted into `column`. A column sum is at most 255 * height, below
    // 2^32 for any JPEG-sized frame; the horizontal sums use 64 bits.
    let mut narrow = vec![0u16; row_len];
    let mut plain = vec![0u32; row_len];
    let mut column = vec![0u32; row_len];
    let divider = Divider::new(width as u64 * height as u64);
    let mut out = vec![0u8; out_width * out_height * C];
    for (span, out_row) in rows.iter().zip(out.chunks_exact_mut(out_width * C)) {
        let row = |i: usize| &src[i * row_len..][..row_len];
        let full_rows = span.full_start()..span.full_start() + span.full;
        if span.full <= NARROW_RUN {
            narrow.fill(0);
            for i in full_rows {
                for (acc, &p) in narrow.iter_mut().zip(row(i)) {
                    *acc += u16::from(p);
                }
            }
            for (c, &n) in column.iter_mut().zip(&narrow) {
                *c = u32::from(n) * row_unit;
            }
        } else {
            plain.fill(0);
            for i in full_rows {
                for (acc, &p) in plain.iter_mut().zip(row(i)) {
                    *acc += u32::from(p);
                }
            }
            for (c, &n) in column.iter_mut().zip(&plain) {
                *c = n * row_unit;
            }
        }
        for (index, weight) in [
            (span.first, span.head),
            (span.full_start() + span.full, span.tail),
        ] {
            if weight > 0 {
                for (acc, &p) in column.iter_mut().zip(row(index)) {
                    *acc += weight * u32::from(p);
                }
            }
        }
        for (col, pixel) in cols.iter().zip(out_row.chunks_exact_mut(C)) {
            // Full columns add; only the partly covered first and last multiply.
            let mut full = [0u64; C];
            let run = &column[col.full_start() * C..][..col.full * C];
            for source in run.chunks_exact(C) {
                for c in 0..C {
                    full[c] += u64::from(source[c]);
                }
            }
            let head = &column[col.first * C..][..C];
            let tail_at = (col.full_start() + col.full).min(width - 1) * C;
            let tail = &column[tail_at..][..C];
            for c in 0..C {
                let sum = full[c] * col_unit
                    + u64::from(col.head) * u64::from(head[c])
                    + u64::from(col.tail) * u64::from(tail[c]);
                pixel[c] = divider.round(sum);
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
    fn tall_runs_past_the_16_bit_sums_stay_exact() {
        // 600 rows of 255 to 1 row: one run of 600 full rows takes the 32-bit path.
        let src = vec![255u8; 600 * 2];
        assert_eq!(area_resize(&src, 2, 600, 1, 1, 1).unwrap(), vec![255]);
        let mixed: Vec<u8> = (0..600u32).map(|i| (i % 256) as u8).collect();
        let mean = (mixed.iter().map(|&p| u64::from(p)).sum::<u64>() * 2 + 600) / 1200;
        assert_eq!(
            area_resize(&mixed, 1, 600, 1, 1, 1).unwrap(),
            vec![mean as u8]
        );
    }

    #[test]
    fn divider_rounds_half_up_exactly() {
        for d in [1u64, 2, 3, 7, 36, 1_000_003, 2_073_600, 1 << 40] {
            let divider = Divider::new(d);
            for sum in (0..=255 * d)
                .step_by((d as usize / 97).max(1))
                .chain([255 * d])
            {
                let want = (2 * sum + d) / (2 * d);
                assert_eq!(u64::from(divider.round(sum)), want, "{sum} / {d}");
            }
        }
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
