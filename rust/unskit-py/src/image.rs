//! Bindings of `unskit_core::image`: `Sha256`, `Crc32c`, `write_hashed`, thumbnails.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice};
use unskit_core::image::{
    self as core, AreaResizer, Frame, PixelOrder, ThumbnailSize, DEFAULT_QUALITY,
};

use crate::errors::{image_error, io_error, to_py};
use crate::gil::detached;

/// Inputs at least this long are worked on with the GIL released. Below it the work costs
/// less than a contended release and re-acquire (see docs/decisions.md, "GIL cut-off").
const DETACHED_BYTES: usize = 16 * 1024;

/// Mutable buffers are copied, and files written, in pieces of this size: small enough to
/// stay in L2 between the copy (or hash) and the next step, large enough that the per-piece
/// cost (a memoryview slice, a GIL round trip, a write call) is lost in the noise.
const PIECE_BYTES: usize = 256 * 1024;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sha256>()?;
    m.add_class::<Crc32c>()?;
    m.add_function(wrap_pyfunction!(write_hashed, m)?)?;
    m.add_function(wrap_pyfunction!(area_resize, m)?)?;
    m.add_function(wrap_pyfunction!(thumbnail, m)?)?;
    m.add_function(wrap_pyfunction!(thumbnail_from_jpeg, m)?)?;
    m.add("DEFAULT_QUALITY", DEFAULT_QUALITY)?;
    let sizes = pyo3::types::PyDict::new(m.py());
    for size in ThumbnailSize::ALL {
        sizes.set_item(size.name(), size.long_edge())?;
    }
    m.add("THUMBNAIL_LONG_EDGES", sizes)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Reading Python buffers.

/// Runs `work` over the bytes of `data` (any buffer-protocol object) in order, in pieces.
///
/// `bytes` is immutable, so it is read in place, detached when large. Anything else may be
/// changed by another thread once the GIL is released, so each piece is first copied (with
/// the GIL held) into a reusable buffer, and `work` runs detached on the copy.
fn for_each_piece<E, F>(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    mut work: F,
) -> PyResult<Result<(), E>>
where
    E: Send,
    F: FnMut(&[u8]) -> Result<(), E> + Send,
{
    if let Ok(bytes) = data.cast::<PyBytes>() {
        let raw = bytes.as_bytes();
        let mut all = || raw.chunks(PIECE_BYTES).try_for_each(&mut work);
        return Ok(if raw.len() >= DETACHED_BYTES {
            detached(py, all)
        } else {
            all()
        });
    }
    let view = flat_view(data)?;
    let len = view.len()?;
    if len <= PIECE_BYTES {
        let copy = PyBuffer::<u8>::get(&view)?.to_vec(py)?;
        return Ok(if len >= DETACHED_BYTES {
            detached(py, || work(&copy))
        } else {
            work(&copy)
        });
    }
    let mut piece = vec![0u8; PIECE_BYTES];
    let mut start = 0;
    while start < len {
        let end = (start + PIECE_BYTES).min(len);
        let part = view.get_item(PySlice::new(py, start as isize, end as isize, 1))?;
        let n = end - start;
        PyBuffer::<u8>::get(&part)?.copy_to_slice(py, &mut piece[..n])?;
        let chunk = &piece[..n];
        if let Err(e) = detached(py, || work(chunk)) {
            return Ok(Err(e));
        }
        start = end;
    }
    Ok(Ok(()))
}

/// A one-dimensional unsigned-byte memoryview of `data`: the bytes of any C-contiguous
/// buffer, whatever its item format (a uint16 or float array hashes as its memory).
fn flat_view<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let view = PyMemoryView::from(data)?;
    // memoryview refuses to cast a view with a zero in its shape; it holds no bytes anyway.
    if view.getattr("nbytes")?.extract::<usize>()? == 0 {
        return Ok(PyBytes::new(data.py(), b"").into_any());
    }
    view.call_method1("cast", ("B",))
}

/// The bytes of `data`: borrowed when it is `bytes`, copied otherwise.
enum Bytes<'py> {
    Shared(Bound<'py, PyBytes>),
    Owned(Vec<u8>),
}

impl Bytes<'_> {
    fn of<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bytes<'py>> {
        if let Ok(bytes) = data.cast::<PyBytes>() {
            return Ok(Bytes::Shared(bytes.clone()));
        }
        let view = flat_view(data)?;
        Ok(Bytes::Owned(PyBuffer::<u8>::get(&view)?.to_vec(data.py())?))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Shared(bytes) => bytes.as_bytes(),
            Bytes::Owned(vec) => vec,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Digests

/// What a digest class needs of its core hasher.
trait Hasher: Clone + Send + 'static {
    const NAME: &'static str;
    const DIGEST_SIZE: usize;
    type Digest: AsRef<[u8]>;
    fn fresh() -> Self;
    fn feed(&mut self, piece: &[u8]);
    fn digest_bytes(&self) -> Self::Digest;
}

impl Hasher for core::Sha256 {
    const NAME: &'static str = "sha256";
    const DIGEST_SIZE: usize = core::Sha256::DIGEST_LEN;
    type Digest = [u8; core::Sha256::DIGEST_LEN];
    fn fresh() -> Self {
        core::Sha256::new()
    }
    fn feed(&mut self, piece: &[u8]) {
        self.update(piece);
    }
    fn digest_bytes(&self) -> Self::Digest {
        self.digest()
    }
}

impl Hasher for core::Crc32c {
    const NAME: &'static str = "crc32c";
    const DIGEST_SIZE: usize = 4;
    type Digest = [u8; 4];
    fn fresh() -> Self {
        core::Crc32c::new()
    }
    fn feed(&mut self, piece: &[u8]) {
        self.update(piece);
    }
    fn digest_bytes(&self) -> Self::Digest {
        self.to_be_bytes()
    }
}

/// A hashlib-style class over a core hasher: `Class(data=None)`, `name`, `digest_size`,
/// `update(buffer)`, `digest()`, `hexdigest()`, `copy()`, then the class's own methods.
/// (PyO3 takes one `#[pymethods]` block per class, so the shared methods are spliced in.)
macro_rules! digest_class {
    ($(#[$doc:meta])* $class:ident($core:ty) { $($own:tt)* }) => {
        $(#[$doc])*
        #[pyclass(module = "unskit._core.image")]
        #[derive(Clone)]
        pub struct $class {
            inner: $core,
        }

        #[pymethods]
        impl $class {
            #[new]
            #[pyo3(signature = (data = None))]
            fn new(py: Python<'_>, data: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
                let mut hasher = $class {
                    inner: <$core as Hasher>::fresh(),
                };
                if let Some(data) = data {
                    hasher.update(py, data)?;
                }
                Ok(hasher)
            }

            #[classattr]
            fn name() -> &'static str {
                <$core as Hasher>::NAME
            }

            #[classattr]
            fn digest_size() -> usize {
                <$core as Hasher>::DIGEST_SIZE
            }

            /// Feeds the bytes of any buffer (bytes, bytearray, memoryview, numpy array).
            fn update(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
                let inner = &mut self.inner;
                for_each_piece(py, data, |piece| {
                    inner.feed(piece);
                    Ok::<(), ()>(())
                })?
                .ok();
                Ok(())
            }

            fn digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
                PyBytes::new(py, self.inner.digest_bytes().as_ref())
            }

            fn hexdigest(&self) -> String {
                hex(self.inner.digest_bytes().as_ref())
            }

            fn copy(&self) -> Self {
                self.clone()
            }

            $($own)*
        }
    };
}

digest_class! {
    /// Streaming SHA-256, hashlib-style: `update(buffer)`, `digest()`, `hexdigest()`, `copy()`.
    Sha256(core::Sha256) {}
}

digest_class! {
    /// Streaming CRC32C; `value` is the int, `digest()` its big-endian bytes, `base64()` what
    /// S3 (x-amz-checksum-crc32c) and GCS (crc32c) expect.
    Crc32c(core::Crc32c) {
        #[getter]
        fn value(&self) -> u32 {
            self.inner.value()
        }

        fn base64(&self) -> String {
            base64_of_4(self.inner.to_be_bytes())
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Standard base64 (with padding) of 4 bytes: always 8 characters ending in `==`.
fn base64_of_4(bytes: [u8; 4]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let n = u32::from_be_bytes(bytes);
    let mut out = String::with_capacity(8);
    for shift in [26, 20, 14, 8, 2] {
        out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
    }
    out.push(ALPHABET[((n & 3) << 4) as usize] as char);
    out.push_str("==");
    out
}

/// Writes `data` to `path` (created or truncated) while hashing it, piece by piece, so each
/// piece is read from memory once for both; returns (bytes written, SHA-256, CRC32C).
#[pyfunction]
#[pyo3(signature = (path, data, *, fsync = false, sha256 = true, crc32c = false))]
fn write_hashed<'py>(
    py: Python<'py>,
    path: PathBuf,
    data: &Bound<'py, PyAny>,
    fsync: bool,
    sha256: bool,
    crc32c: bool,
) -> PyResult<(u64, Option<Bound<'py, PyBytes>>, Option<u32>)> {
    let mut file = detached(py, || File::create(&path)).map_err(|e| io_error(e, &path))?;
    let mut sha = sha256.then(core::Sha256::new);
    let mut crc = crc32c.then(core::Crc32c::new);
    let mut written = 0u64;
    for_each_piece(py, data, |piece| {
        if let Some(sha) = sha.as_mut() {
            sha.update(piece);
        }
        if let Some(crc) = crc.as_mut() {
            crc.update(piece);
        }
        file.write_all(piece)?;
        written += piece.len() as u64;
        Ok(())
    })?
    .map_err(|e| io_error(e, &path))?;
    if fsync {
        detached(py, || file.sync_all()).map_err(|e| io_error(e, &path))?;
    }
    drop(file);
    Ok((
        written,
        sha.map(|s| PyBytes::new(py, &s.digest())),
        crc.map(|c| c.value()),
    ))
}

// ---------------------------------------------------------------------------------------
// Thumbnails

fn quality_of(quality: i64) -> PyResult<u8> {
    u8::try_from(quality)
        .ok()
        .filter(|q| (1..=100).contains(q))
        .ok_or_else(|| image_error(format!("quality {quality} is outside 1..=100")))
}

/// Exact area-average downscale of interleaved 8-bit pixels (what thumbnails use).
#[pyfunction]
fn area_resize<'py>(
    py: Python<'py>,
    pixels: &Bound<'py, PyAny>,
    width: usize,
    height: usize,
    channels: usize,
    out_width: usize,
    out_height: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let bytes = Bytes::of(pixels)?;
    let raw = bytes.as_slice();
    let out = detached(py, || {
        core::area_resize(raw, width, height, channels, out_width, out_height)
    })
    .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

// The signatures spell the default out so Python sees it; it must be the core's.
const _: () = assert!(DEFAULT_QUALITY == 80);

type Encoded<'py> = (Bound<'py, PyBytes>, usize, usize);

/// A JPEG thumbnail of a raw frame (`height` rows of `width` pixels in `order`
/// gray/rgb/bgr), its long edge bounded by `size` (small/medium/large).
#[pyfunction]
#[pyo3(signature = (pixels, width, height, order, size, quality = 80))]
fn thumbnail<'py>(
    py: Python<'py>,
    pixels: &Bound<'py, PyAny>,
    width: usize,
    height: usize,
    order: &str,
    size: &str,
    quality: i64,
) -> PyResult<Encoded<'py>> {
    let order = PixelOrder::from_name(order).map_err(to_py)?;
    let size = ThumbnailSize::from_name(size).map_err(to_py)?;
    let quality = quality_of(quality)?;
    let thumb = if let Ok(bytes) = pixels.cast::<PyBytes>() {
        let frame = Frame {
            pixels: bytes.as_bytes(),
            width,
            height,
            order,
        };
        detached(py, || core::thumbnail_from_frame(&frame, size, quality))
    } else {
        thumbnail_in_pieces(py, pixels, width, height, order, size, quality)?
    }
    .map_err(to_py)?;
    Ok((PyBytes::new(py, &thumb.jpeg), thumb.width, thumb.height))
}

/// A frame in a buffer another thread may change is copied a band of rows at a time (with
/// the GIL held) into the resizer (run detached): no copy of the whole frame, and each band
/// is summed while it is still in cache.
fn thumbnail_in_pieces(
    py: Python<'_>,
    pixels: &Bound<'_, PyAny>,
    width: usize,
    height: usize,
    order: PixelOrder,
    size: ThumbnailSize,
    quality: u8,
) -> PyResult<Result<core::Thumbnail, unskit_core::CoreError>> {
    let view = flat_view(pixels)?;
    let len = view.len()?;
    let (out_width, out_height) =
        core::thumbnail_dimensions(width, height, order, len, size, quality).map_err(to_py)?;
    if (out_width, out_height) == (width, height) {
        let copy = PyBuffer::<u8>::get(&view)?.to_vec(py)?;
        return Ok(detached(py, || {
            core::encode_jpeg(&copy, width, height, order, quality)
        }));
    }
    let mut resizer =
        AreaResizer::new(width, height, order.channels(), out_width, out_height).map_err(to_py)?;
    let row_len = resizer.row_len();
    let band = (PIECE_BYTES / row_len).max(1) * row_len;
    let mut piece = vec![0u8; band];
    let mut start = 0;
    while start < len {
        let end = (start + band).min(len);
        let part = view.get_item(PySlice::new(py, start as isize, end as isize, 1))?;
        let rows = &mut piece[..end - start];
        PyBuffer::<u8>::get(&part)?.copy_to_slice(py, rows)?;
        let rows = &*rows;
        let resizer = &mut resizer;
        if let Err(e) = detached(py, || resizer.push_rows(rows)) {
            return Ok(Err(e));
        }
        start = end;
    }
    Ok(detached(py, || {
        let small = resizer.finish()?;
        core::encode_jpeg(&small, out_width, out_height, order, quality)
    }))
}

/// A JPEG thumbnail of JPEG bytes, decoded at a reduced DCT scale where that suffices.
#[pyfunction]
#[pyo3(signature = (data, size, quality = 80))]
fn thumbnail_from_jpeg<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    size: &str,
    quality: i64,
) -> PyResult<Encoded<'py>> {
    let size = ThumbnailSize::from_name(size).map_err(to_py)?;
    let quality = quality_of(quality)?;
    let bytes = Bytes::of(data)?;
    let raw = bytes.as_slice();
    let thumb = detached(py, || core::thumbnail_from_jpeg(raw, size, quality)).map_err(to_py)?;
    Ok((PyBytes::new(py, &thumb.jpeg), thumb.width, thumb.height))
}
