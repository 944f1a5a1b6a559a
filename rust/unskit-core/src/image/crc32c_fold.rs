//! CRC32C for CPUs with AVX2 VPCLMULQDQ but no AVX-512 (AMD Zen 3, Intel Alder Lake and
//! later), where `crc-fast` falls back to 128-bit PCLMULQDQ folding and runs below the CRC32
//! instruction's own rate (docs/decisions.md). Each superblock is split in two: one part
//! folded with carry-less multiplies on the vector units, the other read by three CRC32
//! instruction streams on the integer units at the same time; the four partial CRCs are
//! then shifted into place and xored.
//!
//! The message is a polynomial over GF(2); its CRC depends only on it modulo P. Folding
//! replaces a 16-byte block R, d bits before a later block, by T = R * x^d mod P (of degree
//! below 96) xored into that block: two carry-less multiplies per block, no reduction until
//! the last 16 bytes, which the CRC32 instruction reduces. Shifting a CRC c over n bytes
//! (the CRC of its message followed by n zero bytes) is c * x^8n mod P: one multiply, and
//! the CRC32 instruction reduces the 64-bit product.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// CRC32C's polynomial, x^32 implied (normal bit order).
const POLY: u64 = 0x1_1EDC_6F41;
/// Below this many bytes the CRC32 instruction alone is as fast.
const MIN_FOLD_BYTES: usize = 256;

/// x^e mod P, in normal bit order.
const fn x_pow_mod(e: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < e {
        r <<= 1;
        if r >> 32 != 0 {
            r ^= POLY;
        }
        i += 1;
    }
    r as u32
}

/// x^e mod P as a reflected 64-bit lane (its 32 bits at the top, where a reflected value
/// of degree below 32 sits).
const fn lane(e: u32) -> i64 {
    ((x_pow_mod(e).reverse_bits() as u64) << 32) as i64
}

/// (low lane, high lane) constants that fold a 128-bit block over `bits` bits: the low lane
/// holds the block's first 8 bytes (x^64 higher), and the 127-bit product of two reflected
/// 64-bit values carries one factor of x more, hence the - 1 in both.
const fn fold_by(bits: u32) -> (i64, i64) {
    (lane(bits + 63), lane(bits - 1))
}

const BY_1024: (i64, i64) = fold_by(1024);
const BY_256: (i64, i64) = fold_by(256);
const BY_128: (i64, i64) = fold_by(128);

/// Per step of a superblock: 128 bytes folded, and this many 8-byte words per stream.
const STREAM_WORDS: usize = 6;
/// Steps per superblock: enough that the per-superblock reduction and shifts are noise.
const STEPS: usize = 16;
const FOLD_BYTES: usize = 128 * STEPS;
const STREAM_BYTES: usize = 8 * STREAM_WORDS * STEPS;
const SUPERBLOCK_BYTES: usize = FOLD_BYTES + 3 * STREAM_BYTES;

/// The constant that shifts a CRC over `bytes` bytes: the reflected product of two 32-bit
/// values has one factor of x less, and the CRC32 instruction's reduction multiplies by x^32.
const fn shift_by(bytes: u32) -> i64 {
    x_pow_mod(8 * bytes - 33).reverse_bits() as i64
}

const SHIFT_1: i64 = shift_by(STREAM_BYTES as u32);
const SHIFT_2: i64 = shift_by(2 * STREAM_BYTES as u32);
const SHIFT_3: i64 = shift_by(3 * STREAM_BYTES as u32);

/// Whether this CPU runs the fold (checked once by std, an atomic load after that).
#[cfg(target_arch = "x86_64")]
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.2")
}

#[cfg(not(target_arch = "x86_64"))]
pub fn available() -> bool {
    false
}

/// The raw CRC32C state (before the final inversion) after `data`, from raw `state`.
///
/// # Safety
/// The CPU must have what [`available`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub unsafe fn update(mut state: u32, data: &[u8]) -> u32 {
    let mut superblocks = data.chunks_exact(SUPERBLOCK_BYTES);
    for superblock in &mut superblocks {
        state = update_superblock(state, superblock);
    }
    update_folded(state, superblocks.remainder())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn update_superblock(state: u32, superblock: &[u8]) -> u32 {
    let (folded, streams) = superblock.split_at(FOLD_BYTES);
    let (first, rest) = streams.split_at(STREAM_BYTES);
    let (second, third) = rest.split_at(STREAM_BYTES);
    let words = |stream: &[u8], step: usize, word: usize| -> u64 {
        let at = 8 * (step * STREAM_WORDS + word);
        u64::from_le_bytes(stream[at..at + 8].try_into().expect("8 bytes"))
    };
    let k1024 = _mm256_set_epi64x(BY_1024.1, BY_1024.0, BY_1024.1, BY_1024.0);
    let mut acc = start(state, &folded[..128]);
    let (mut c1, mut c2, mut c3) = (0u64, 0u64, 0u64);
    for step in 0..STEPS {
        if step + 1 < STEPS {
            fold_in(&mut acc, &folded[128 * (step + 1)..], k1024);
        }
        for word in 0..STREAM_WORDS {
            c1 = _mm_crc32_u64(c1, words(first, step, word));
            c2 = _mm_crc32_u64(c2, words(second, step, word));
            c3 = _mm_crc32_u64(c3, words(third, step, word));
        }
    }
    let folded = reduce(acc, &[]);
    shift(folded, SHIFT_3) ^ shift(c1 as u32, SHIFT_2) ^ shift(c2 as u32, SHIFT_1) ^ c3 as u32
}

/// The CRC of a part shorter than a superblock: folded alone when long enough.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn update_folded(state: u32, data: &[u8]) -> u32 {
    if data.len() < MIN_FOLD_BYTES {
        return crc32_instruction(state, data);
    }
    let k1024 = _mm256_set_epi64x(BY_1024.1, BY_1024.0, BY_1024.1, BY_1024.0);
    let mut chunks = data.chunks_exact(128);
    let mut acc = start(state, chunks.next().expect("at least 256 bytes"));
    for chunk in &mut chunks {
        fold_in(&mut acc, chunk, k1024);
    }
    reduce(acc, chunks.remainder())
}

/// The first 128 bytes, with the state entering as its first four bytes xored (the CRC is
/// linear).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn start(state: u32, chunk: &[u8]) -> [__m256i; 4] {
    let mut acc = load4(chunk);
    acc[0] = _mm256_xor_si256(acc[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, state as i32));
    acc
}

/// Folds the four accumulators into one block, then the `rest` (under 128 bytes) into it
/// 16 bytes at a time; the CRC32 instruction reduces the block and the last bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn reduce(acc: [__m256i; 4], rest: &[u8]) -> u32 {
    let k256 = _mm256_set_epi64x(BY_256.1, BY_256.0, BY_256.1, BY_256.0);
    let k128 = _mm_set_epi64x(BY_128.1, BY_128.0);
    let mut folded = acc[0];
    for a in &acc[1..] {
        folded = _mm256_xor_si256(fold256(folded, k256), *a);
    }
    let mut block = _mm_xor_si128(
        fold128(_mm256_castsi256_si128(folded), k128),
        _mm256_extracti128_si256::<1>(folded),
    );
    let mut blocks = rest.chunks_exact(16);
    for b in &mut blocks {
        let next = _mm_loadu_si128(b.as_ptr().cast());
        block = _mm_xor_si128(fold128(block, k128), next);
    }
    let mut last = [0u8; 16];
    _mm_storeu_si128(last.as_mut_ptr().cast(), block);
    let crc = crc32_instruction(0, &last);
    crc32_instruction(crc, blocks.remainder())
}

/// `crc` shifted over the bytes `constant` was made for ([`shift_by`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,sse4.2")]
unsafe fn shift(crc: u32, constant: i64) -> u32 {
    let product =
        _mm_clmulepi64_si128::<0x00>(_mm_cvtsi32_si128(crc as i32), _mm_cvtsi64_si128(constant));
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn load4(chunk: &[u8]) -> [__m256i; 4] {
    let p = chunk.as_ptr().cast::<__m256i>();
    [
        _mm256_loadu_si256(p),
        _mm256_loadu_si256(p.add(1)),
        _mm256_loadu_si256(p.add(2)),
        _mm256_loadu_si256(p.add(3)),
    ]
}

/// Folds the four accumulators over 1024 bits onto the next 128 bytes of `chunk`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq")]
unsafe fn fold_in(acc: &mut [__m256i; 4], chunk: &[u8], k1024: __m256i) {
    for (a, n) in acc.iter_mut().zip(load4(chunk)) {
        *a = _mm256_xor_si256(fold256(*a, k1024), n);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq")]
unsafe fn fold256(x: __m256i, k: __m256i) -> __m256i {
    _mm256_xor_si256(
        _mm256_clmulepi64_epi128::<0x00>(x, k),
        _mm256_clmulepi64_epi128::<0x11>(x, k),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq")]
unsafe fn fold128(x: __m128i, k: __m128i) -> __m128i {
    _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(x, k),
        _mm_clmulepi64_si128::<0x11>(x, k),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32_instruction(mut crc: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    let mut wide = u64::from(crc);
    for w in &mut words {
        wide = _mm_crc32_u64(wide, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    crc = wide as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    crc
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Bitwise CRC32C, the definition itself.
    fn reference(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    #[test]
    fn fold_matches_the_definition_at_every_length_and_state() {
        if !available() {
            return;
        }
        let data: Vec<u8> = (0..10_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let superblock = SUPERBLOCK_BYTES;
        let around = [
            superblock - 1,
            superblock,
            superblock + 1,
            2 * superblock + 17,
        ];
        for len in (0..700)
            .chain([1_023, 1_024, 1_025])
            .chain(around)
            .chain([10_000])
        {
            for state in [0, !0, 0x1234_5678] {
                let want = reference(state, &data[..len]);
                assert_eq!(unsafe { update(state, &data[..len]) }, want, "len {len}");
            }
        }
    }
}
