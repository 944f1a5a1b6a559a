//! The few TurboJPEG calls the JPEG thumbnail needs, from the system libjpeg-turbo (2.x API).
//!
//! Hand-declared rather than through the `turbojpeg` crate: its 1.x releases bind the 3.x
//! `tj3*` API, which Debian 12 does not ship, and otherwise build libjpeg-turbo from source
//! (cmake + nasm in every wheel build). TurboJPEG reports every libjpeg error through its
//! own setjmp handler and a -1 return, never `exit()`, so bad bytes become a `CoreError`.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::ptr;

use crate::CoreError;

type TjHandle = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct TjScalingFactor {
    num: c_int,
    denom: c_int,
}

pub const SAMP_420: c_int = 2;
pub const SAMP_GRAY: c_int = 3;
pub const CS_RGB: c_int = 0;
pub const CS_YCBCR: c_int = 1;
pub const CS_GRAY: c_int = 2;
pub const PF_RGB: c_int = 0;
pub const PF_GRAY: c_int = 6;
const ERR_WARNING: c_int = 0;

#[link(name = "turbojpeg")]
extern "C" {
    fn tjInitCompress() -> TjHandle;
    fn tjInitDecompress() -> TjHandle;
    fn tjDestroy(handle: TjHandle) -> c_int;
    fn tjGetErrorStr2(handle: TjHandle) -> *mut c_char;
    fn tjGetErrorCode(handle: TjHandle) -> c_int;
    fn tjFree(buffer: *mut u8);
    fn tjGetScalingFactors(count: *mut c_int) -> *mut TjScalingFactor;
    fn tjPlaneWidth(component: c_int, width: c_int, subsamp: c_int) -> c_int;
    fn tjPlaneHeight(component: c_int, height: c_int, subsamp: c_int) -> c_int;
    fn tjDecompressHeader3(
        handle: TjHandle,
        jpeg: *const u8,
        jpeg_size: c_ulong,
        width: *mut c_int,
        height: *mut c_int,
        subsamp: *mut c_int,
        colorspace: *mut c_int,
    ) -> c_int;
    fn tjDecompress2(
        handle: TjHandle,
        jpeg: *const u8,
        jpeg_size: c_ulong,
        dst: *mut u8,
        width: c_int,
        pitch: c_int,
        height: c_int,
        pixel_format: c_int,
        flags: c_int,
    ) -> c_int;
    fn tjDecompressToYUVPlanes(
        handle: TjHandle,
        jpeg: *const u8,
        jpeg_size: c_ulong,
        planes: *mut *mut u8,
        width: c_int,
        strides: *mut c_int,
        height: c_int,
        flags: c_int,
    ) -> c_int;
    fn tjCompress2(
        handle: TjHandle,
        src: *const u8,
        width: c_int,
        pitch: c_int,
        height: c_int,
        pixel_format: c_int,
        jpeg: *mut *mut u8,
        jpeg_size: *mut c_ulong,
        subsamp: c_int,
        quality: c_int,
        flags: c_int,
    ) -> c_int;
    fn tjCompressFromYUVPlanes(
        handle: TjHandle,
        planes: *const *const u8,
        width: c_int,
        strides: *const c_int,
        height: c_int,
        subsamp: c_int,
        jpeg: *mut *mut u8,
        jpeg_size: *mut c_ulong,
        quality: c_int,
        flags: c_int,
    ) -> c_int;
}

/// One TurboJPEG instance, destroyed on drop.
struct Handle(TjHandle);

impl Handle {
    fn new(init: unsafe extern "C" fn() -> TjHandle) -> Result<Handle, CoreError> {
        // SAFETY: the init functions take nothing and return NULL on failure.
        let raw = unsafe { init() };
        if raw.is_null() {
            return Err(CoreError::InvalidImage(
                "TurboJPEG could not allocate an instance".into(),
            ));
        }
        Ok(Handle(raw))
    }

    /// The handle's last error message.
    fn message(&self) -> String {
        // SAFETY: a live handle; the string is owned by the handle and copied out at once.
        let text = unsafe { tjGetErrorStr2(self.0) };
        if text.is_null() {
            return "unknown error".into();
        }
        // SAFETY: a NUL-terminated string TurboJPEG keeps for the handle's lifetime.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// Maps a call's return code to its message: -1 is an error, except a warning
    /// `accept` lets through.
    fn check(&self, code: c_int, accept: impl Fn(&str) -> bool) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        let message = self.message();
        // SAFETY: a live handle.
        let warning = unsafe { tjGetErrorCode(self.0) } == ERR_WARNING;
        if warning && accept(&message) {
            return Ok(());
        }
        Err(message)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by tjInit*, destroyed once.
        unsafe { tjDestroy(self.0) };
    }
}

/// A decoder over one JPEG's bytes.
pub struct Decoder<'a> {
    handle: Handle,
    jpeg: &'a [u8],
    pub width: usize,
    pub height: usize,
    pub subsamp: c_int,
    pub colorspace: c_int,
}

fn malformed(message: String) -> CoreError {
    CoreError::MalformedImage(format!("JPEG: {message}"))
}

fn c_size(jpeg: &[u8]) -> Result<c_ulong, CoreError> {
    c_ulong::try_from(jpeg.len())
        .map_err(|_| CoreError::MalformedImage("JPEG: too many bytes".into()))
}

/// Warnings a whole image survives: stray bytes between segments (some cameras write them;
/// the previous decoder accepted them too). A truncated or corrupt scan stays an error.
fn harmless_warning(message: &str) -> bool {
    message.contains("extraneous bytes before marker")
}

impl<'a> Decoder<'a> {
    /// Reads the JPEG's header; `None` for a sampling layout TurboJPEG 2.x does not name
    /// (e.g. a CMYK JPEG with subsampled channels), which libjpeg-turbo cannot decode.
    pub fn new(jpeg: &'a [u8]) -> Result<Option<Decoder<'a>>, CoreError> {
        if jpeg.is_empty() {
            // TurboJPEG would say only "Invalid argument".
            return Err(CoreError::MalformedImage("JPEG: no bytes".into()));
        }
        let handle = Handle::new(tjInitDecompress)?;
        let (mut width, mut height, mut subsamp, mut colorspace) = (0, 0, -1, -1);
        // SAFETY: the pointer and length describe `jpeg`; the outputs are local ints.
        let code = unsafe {
            tjDecompressHeader3(
                handle.0,
                jpeg.as_ptr(),
                c_size(jpeg)?,
                &mut width,
                &mut height,
                &mut subsamp,
                &mut colorspace,
            )
        };
        if let Err(message) = handle.check(code, harmless_warning) {
            if message.contains("Could not determine subsampling type") {
                return Ok(None);
            }
            return Err(malformed(message));
        }
        if width <= 0 || height <= 0 {
            return Err(CoreError::MalformedImage(format!(
                "JPEG: a {width}x{height} frame"
            )));
        }
        Ok(Some(Decoder {
            handle,
            jpeg,
            width: width as usize,
            height: height as usize,
            subsamp,
            colorspace,
        }))
    }

    /// The smallest DCT scale (at most 1/1) whose output covers `width` x `height`, and
    /// the dimensions it decodes to.
    pub fn scaled_size(&self, width: usize, height: usize) -> (usize, usize) {
        let mut count: c_int = 0;
        // SAFETY: returns a static table of `count` entries (or NULL).
        let table = unsafe { tjGetScalingFactors(&mut count) };
        let factors: &[TjScalingFactor] = if table.is_null() || count <= 0 {
            &[]
        } else {
            // SAFETY: `count` initialised entries that live as long as the library.
            unsafe { std::slice::from_raw_parts(table, count as usize) }
        };
        let scaled =
            |edge: usize, f: TjScalingFactor| (edge * f.num as usize).div_ceil(f.denom as usize);
        factors
            .iter()
            .filter(|f| f.num > 0 && f.num <= f.denom)
            .map(|&f| (scaled(self.width, f), scaled(self.height, f)))
            .filter(|&(w, h)| w >= width && h >= height)
            .min()
            .unwrap_or((self.width, self.height))
    }

    /// Decodes at the scale that gives exactly `width` x `height` (from `scaled_size`) into
    /// the JPEG's own planes (Y, or Y Cb Cr at its subsampling): no colour conversion and no
    /// chroma upsampling.
    pub fn decode_planes(&self, width: usize, height: usize) -> Result<Planes, CoreError> {
        let mut planes = Planes::new(width, height, self.subsamp)?;
        let mut pointers = [ptr::null_mut::<u8>(); 3];
        for (pointer, plane) in pointers.iter_mut().zip(planes.data.iter_mut()) {
            *pointer = plane.as_mut_ptr();
        }
        let mut strides = planes.strides();
        // SAFETY: each plane holds stride x plane-height bytes, as TurboJPEG computes them
        // for this size and subsampling (tjPlaneWidth/Height); `jpeg` is borrowed.
        let code = unsafe {
            tjDecompressToYUVPlanes(
                self.handle.0,
                self.jpeg.as_ptr(),
                c_size(self.jpeg)?,
                pointers.as_mut_ptr(),
                width as c_int,
                strides.as_mut_ptr(),
                height as c_int,
                0,
            )
        };
        self.handle
            .check(code, harmless_warning)
            .map_err(malformed)?;
        Ok(planes)
    }

    /// Decodes at the scale that gives exactly `width` x `height` into packed pixels.
    pub fn decode_packed(
        &self,
        width: usize,
        height: usize,
        pixel_format: c_int,
    ) -> Result<Vec<u8>, CoreError> {
        let channels = if pixel_format == PF_GRAY { 1 } else { 3 };
        let mut pixels = vec![0u8; width * height * channels];
        // SAFETY: `pixels` holds height rows of width * channels bytes (the pitch given).
        let code = unsafe {
            tjDecompress2(
                self.handle.0,
                self.jpeg.as_ptr(),
                c_size(self.jpeg)?,
                pixels.as_mut_ptr(),
                width as c_int,
                (width * channels) as c_int,
                height as c_int,
                pixel_format,
                0,
            )
        };
        self.handle
            .check(code, harmless_warning)
            .map_err(malformed)?;
        Ok(pixels)
    }
}

/// An image as separate tightly packed planes: one (gray) or three (Y, Cb, Cr).
pub struct Planes {
    pub width: usize,
    pub height: usize,
    pub subsamp: c_int,
    pub sizes: Vec<(usize, usize)>,
    pub data: Vec<Vec<u8>>,
}

impl Planes {
    /// Zeroed planes of an image of `width` x `height` at `subsamp`.
    pub fn new(width: usize, height: usize, subsamp: c_int) -> Result<Planes, CoreError> {
        let sizes = Self::sizes(width, height, subsamp)?;
        let data = sizes.iter().map(|&(w, h)| vec![0u8; w * h]).collect();
        Ok(Planes {
            width,
            height,
            subsamp,
            sizes,
            data,
        })
    }

    /// Each plane's width and height for an image of `width` x `height` at `subsamp`.
    pub fn sizes(
        width: usize,
        height: usize,
        subsamp: c_int,
    ) -> Result<Vec<(usize, usize)>, CoreError> {
        let count = if subsamp == SAMP_GRAY { 1 } else { 3 };
        let mut sizes = Vec::with_capacity(count);
        for component in 0..count as c_int {
            // SAFETY: pure arithmetic on the arguments; -1 on a bad subsampling.
            let (w, h) = unsafe {
                (
                    tjPlaneWidth(component, width as c_int, subsamp),
                    tjPlaneHeight(component, height as c_int, subsamp),
                )
            };
            if w <= 0 || h <= 0 {
                return Err(CoreError::MalformedImage(format!(
                    "JPEG: subsampling {subsamp} is not supported for thumbnails"
                )));
            }
            sizes.push((w as usize, h as usize));
        }
        Ok(sizes)
    }

    fn strides(&self) -> [c_int; 3] {
        let mut strides = [0; 3];
        for (stride, &(w, _)) in strides.iter_mut().zip(&self.sizes) {
            *stride = w as c_int;
        }
        strides
    }
}

/// Owns a buffer TurboJPEG allocated.
struct TjBuffer(*mut u8);

impl Drop for TjBuffer {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by TurboJPEG (tjAlloc), freed once.
            unsafe { tjFree(self.0) };
        }
    }
}

fn compressed(
    handle: &Handle,
    code: c_int,
    buffer: &TjBuffer,
    size: c_ulong,
) -> Result<Vec<u8>, CoreError> {
    handle
        .check(code, |_| false)
        .map_err(|e| CoreError::InvalidImage(format!("JPEG encode: {e}")))?;
    if buffer.0.is_null() {
        return Err(CoreError::InvalidImage("JPEG encode: no output".into()));
    }
    // SAFETY: TurboJPEG wrote `size` bytes to the buffer it allocated.
    Ok(unsafe { std::slice::from_raw_parts(buffer.0, size as usize) }.to_vec())
}

/// Encodes planes (Y, or Y Cb Cr at 4:2:0) as a baseline JPEG at `quality`.
pub fn encode_planes(planes: &Planes, quality: u8) -> Result<Vec<u8>, CoreError> {
    let handle = Handle::new(tjInitCompress)?;
    let mut pointers = [ptr::null::<u8>(); 3];
    for (pointer, plane) in pointers.iter_mut().zip(&planes.data) {
        *pointer = plane.as_ptr();
    }
    let strides = planes.strides();
    let mut buffer = TjBuffer(ptr::null_mut());
    let mut size: c_ulong = 0;
    // SAFETY: each plane holds stride x plane-height bytes for this size and subsampling;
    // TurboJPEG allocates the output into `buffer`, which frees it.
    let code = unsafe {
        tjCompressFromYUVPlanes(
            handle.0,
            pointers.as_ptr(),
            planes.width as c_int,
            strides.as_ptr(),
            planes.height as c_int,
            planes.subsamp,
            &mut buffer.0,
            &mut size,
            c_int::from(quality),
            0,
        )
    };
    compressed(&handle, code, &buffer, size)
}

/// Encodes packed pixels (RGB or gray) as a baseline JPEG at `quality`.
pub fn encode_packed(
    pixels: &[u8],
    width: usize,
    height: usize,
    pixel_format: c_int,
    quality: u8,
) -> Result<Vec<u8>, CoreError> {
    let (channels, subsamp) = if pixel_format == PF_GRAY {
        (1, SAMP_GRAY)
    } else {
        (3, SAMP_420)
    };
    if pixels.len() != width * height * channels {
        return Err(CoreError::InvalidImage(format!(
            "{} bytes do not hold a {width}x{height} thumbnail",
            pixels.len()
        )));
    }
    let handle = Handle::new(tjInitCompress)?;
    let mut buffer = TjBuffer(ptr::null_mut());
    let mut size: c_ulong = 0;
    // SAFETY: `pixels` holds height rows of width * channels bytes (the pitch given).
    let code = unsafe {
        tjCompress2(
            handle.0,
            pixels.as_ptr(),
            width as c_int,
            (width * channels) as c_int,
            height as c_int,
            pixel_format,
            &mut buffer.0,
            &mut size,
            subsamp,
            c_int::from(quality),
            0,
        )
    };
    compressed(&handle, code, &buffer, size)
}
