//! Streaming SHA-256 and CRC32C: feed bytes in any split, read the digest at any point.

use sha2::Digest;

use super::crc32c_fold;

/// Streaming SHA-256 (SHA-NI when the CPU has it, chosen at run time by `sha2`).
#[derive(Clone, Default)]
pub struct Sha256(sha2::Sha256);

impl Sha256 {
    pub const DIGEST_LEN: usize = 32;

    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of everything fed so far; the hasher keeps going.
    pub fn digest(&self) -> [u8; 32] {
        self.0.clone().finalize().into()
    }
}

/// Streaming CRC32C (Castagnoli): folded 256 bits at a time with AVX2 VPCLMULQDQ where the
/// CPU has it without AVX-512 (`crc32c_fold`), else by `crc-fast`, which picks VPCLMULQDQ
/// with AVX-512, PCLMULQDQ or the ARM equivalents at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, data: &[u8]) {
        // The raw state is the value before the final inversion.
        let raw = !self.0;
        self.0 = if fold_is_fastest() {
            // SAFETY: fold_is_fastest checked the CPU features the fold needs.
            !unsafe { crc32c_fold::update(raw, data) }
        } else {
            let mut digest = crc_fast::Digest::new_with_init_state(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                u64::from(raw),
            );
            digest.update(data);
            digest.finalize() as u32
        };
    }

    pub fn value(&self) -> u32 {
        self.0
    }

    /// The big-endian 4 bytes cloud stores carry (S3 x-amz-checksum-crc32c, GCS crc32c).
    pub fn to_be_bytes(&self) -> [u8; 4] {
        self.0.to_be_bytes()
    }
}

/// The fold where the CPU runs it and `crc-fast` has no AVX-512 kernel to beat it.
fn fold_is_fastest() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crc32c_fold::available() && !std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_matches_nist_vectors() {
        let empty = Sha256::new();
        assert_eq!(
            hex(&empty.digest()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut abc = Sha256::new();
        abc.update(b"abc");
        assert_eq!(
            hex(&abc.digest()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut two_blocks = Sha256::new();
        two_blocks.update(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
        assert_eq!(
            hex(&two_blocks.digest()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn sha256_streams_in_any_split_and_digest_does_not_end_it() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut whole = Sha256::new();
        whole.update(&data);
        for cut in [0, 1, 63, 64, 65, 4096, 9_999, 10_000] {
            let mut split = Sha256::new();
            split.update(&data[..cut]);
            let _ = split.digest();
            split.update(&data[cut..]);
            assert_eq!(split.digest(), whole.digest(), "cut at {cut}");
        }
    }

    #[test]
    fn crc32c_check_value_and_split() {
        let mut crc = Crc32c::new();
        crc.update(b"123456789");
        assert_eq!(crc.value(), 0xE306_9283);
        assert_eq!(crc.to_be_bytes(), [0xE3, 0x06, 0x92, 0x83]);
        let mut split = Crc32c::new();
        split.update(b"1234");
        split.update(b"");
        split.update(b"56789");
        assert_eq!(split, crc);
        assert_eq!(Crc32c::new().value(), 0);
    }

    #[test]
    fn crc32c_streams_in_any_split_at_every_length() {
        let data: Vec<u8> = (0..5_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut oneshot = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        oneshot.update(&data);
        let mut whole = Crc32c::new();
        whole.update(&data);
        assert_eq!(u64::from(whole.value()), oneshot.finalize());
        for cut in [0, 1, 255, 256, 257, 1_000, 4_095, 4_999, 5_000] {
            let mut split = Crc32c::new();
            split.update(&data[..cut]);
            split.update(&data[cut..]);
            assert_eq!(split, whole, "cut at {cut}");
        }
    }
}
