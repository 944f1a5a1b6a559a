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
    let expected = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(channels));
    if expected != Some(src.len()) {
        return Err(CoreError::InvalidImage(format!(
            "{} bytes do not hold {width}x{height} pixels of {channels} channel(s)",
            src.len()
        )));
    }
    let mut resizer = AreaResizer::new(width, height, channels, out_width, out_height)?;
    resizer.push_rows(src)?;
    resizer.finish()
}

/// The area average fed row by row, so a caller can hand over a frame in pieces (copied
/// from a buffer it may not hold across threads) and never hold a whole copy.
pub struct AreaResizer {
    width: usize,
    height: usize,
    channels: usize,
    out_width: usize,
    rows: Vec<Span>,
    cols: Vec<Span>,
    /// The next source row expected, and the output row it contributes to.
    next_row: usize,
    out_row: usize,
    /// Sums of the current output row's fully covered source rows, in 16 bits while the
    /// run is short enough (255 * 257 = 65535), else in 32.
    narrow: Vec<u16>,
    plain: Vec<u32>,
    /// Weighted sums of its partly covered rows, then the whole column sum.
    column: Vec<u32>,
    divider: Divider,
    out: Vec<u8>,
}

impl AreaResizer {
    pub fn new(
        width: usize,
        height: usize,
        channels: usize,
        out_width: usize,
        out_height: usize,
    ) -> Result<AreaResizer, CoreError> {
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
        let row_len = width * channels;
        Ok(AreaResizer {
            width,
            height,
            channels,
            out_width,
            rows: spans(height, out_height),
            cols: spans(width, out_width),
            next_row: 0,
            out_row: 0,
            narrow: vec![0; row_len],
            plain: vec![0; row_len],
            column: vec![0; row_len],
            divider: Divider::new(width as u64 * height as u64),
            out: Vec::with_capacity(out_width * out_height * channels),
        })
    }

    /// Bytes of one source row.
    pub fn row_len(&self) -> usize {
        self.width * self.channels
    }

    /// Feeds the next whole rows, top to bottom.
    pub fn push_rows(&mut self, rows: &[u8]) -> Result<(), CoreError> {
        let row_len = self.row_len();
        if !rows.len().is_multiple_of(row_len) || self.next_row + rows.len() / row_len > self.height
        {
            return Err(CoreError::InvalidImage(format!(
                "{} bytes are not whole rows of {row_len} within the {} rows left",
                rows.len(),
                self.height - self.next_row
            )));
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked on the line above.
            unsafe { self.push_rows_avx2(rows) };
            return Ok(());
        }
        for row in rows.chunks_exact(row_len) {
            self.push_row(row);
        }
        Ok(())
    }

    /// The same loops compiled for AVX2 (twice the lanes of the SSE2 baseline for the row
    /// sums, and a 32-bit multiply for the weighted ones); chosen at run time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn push_rows_avx2(&mut self, rows: &[u8]) {
        for row in rows.chunks_exact(self.row_len()) {
            self.push_row(row);
        }
    }

    /// The resized pixels, once every source row has been fed.
    pub fn finish(self) -> Result<Vec<u8>, CoreError> {
        if self.next_row != self.height {
            return Err(CoreError::InvalidImage(format!(
                "{} of {} rows fed",
                self.next_row, self.height
            )));
        }
        Ok(self.out)
    }

    #[inline(always)]
    fn push_row(&mut self, row: &[u8]) {
        let r = self.next_row;
        self.next_row += 1;
        // A row adds to the output row it falls in; a row split between two output rows
        // ends one (as its tail) and starts the next (as its head).
        loop {
            let span = self.rows[self.out_row];
            let last = span.full_start() + span.full - usize::from(span.tail == 0);
            if r == span.first && span.head > 0 {
                weighted_add(&mut self.column, row, span.head);
            } else if r < span.full_start() + span.full {
                if span.full <= NARROW_RUN {
                    for (acc, &p) in self.narrow.iter_mut().zip(row) {
                        *acc += u16::from(p);
                    }
                } else {
                    for (acc, &p) in self.plain.iter_mut().zip(row) {
                        *acc += u32::from(p);
                    }
                }
            } else {
                weighted_add(&mut self.column, row, span.tail);
            }
            let ends_here = r == last.max(span.first);
            if !ends_here {
                return;
            }
            self.finish_out_row(span);
            self.out_row += 1;
            let starts_next = self
                .rows
                .get(self.out_row)
                .is_some_and(|next| next.first == r && next.head > 0);
            if !starts_next {
                return;
            }
        }
    }

    #[inline(always)]
    fn finish_out_row(&mut self, span: Span) {
        let unit = self.rows.len() as u32;
        if span.full <= NARROW_RUN {
            for (c, n) in self.column.iter_mut().zip(&mut self.narrow) {
                *c += u32::from(*n) * unit;
                *n = 0;
            }
        } else {
            for (c, n) in self.column.iter_mut().zip(&mut self.plain) {
                *c += *n * unit;
                *n = 0;
            }
        }
        match self.channels {
            1 => self.horizontal::<1>(),
            2 => self.horizontal::<2>(),
            3 => self.horizontal::<3>(),
            _ => self.horizontal::<4>(),
        }
        self.column.fill(0);
    }

    fn horizontal<const C: usize>(&mut self) {
        let col_unit = self.out_width as u64;
        let column = &self.column;
        let last = (self.width - 1) * C;
        for col in &self.cols {
            // Full columns add; only the partly covered first and last multiply.
            let mut full = [0u64; C];
            for source in column[col.full_start() * C..][..col.full * C].chunks_exact(C) {
                for c in 0..C {
                    full[c] += u64::from(source[c]);
                }
            }
            let head = &column[col.first * C..][..C];
            let tail = &column[((col.full_start() + col.full) * C).min(last)..][..C];
            for c in 0..C {
                let sum = full[c] * col_unit
                    + u64::from(col.head) * u64::from(head[c])
                    + u64::from(col.tail) * u64::from(tail[c]);
                self.out.push(self.divider.round(sum));
            }
        }
    }
}

#[inline(always)]
fn weighted_add(column: &mut [u32], row: &[u8], weight: u32) {
    for (acc, &p) in column.iter_mut().zip(row) {
        *acc += weight * u32::from(p);
    }
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
    fn rows_fed_in_any_pieces_give_the_same_result() {
        let src: Vec<u8> = (0..97 * 61 * 3).map(|i| (i * 31 % 251) as u8).collect();
        let whole = area_resize(&src, 97, 61, 3, 29, 17).unwrap();
        for rows_per_piece in [1, 2, 7, 60] {
            let mut resizer = AreaResizer::new(97, 61, 3, 29, 17).unwrap();
            for piece in src.chunks(rows_per_piece * resizer.row_len()) {
                resizer.push_rows(piece).unwrap();
            }
            assert_eq!(resizer.finish().unwrap(), whole);
        }
        let mut short = AreaResizer::new(97, 61, 3, 29, 17).unwrap();
        short.push_rows(&src[..97 * 3 * 60]).unwrap();
        assert!(short.finish().is_err());
        let mut ragged = AreaResizer::new(97, 61, 3, 29, 17).unwrap();
        assert!(ragged.push_rows(&src[..100]).is_err());
        assert!(ragged
            .push_rows(&[src.as_slice(), &src[..291]].concat())
            .is_err());
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
