//! Image kernels: streaming digests of the stored file, and thumbnails (area-average
//! resize + JPEG encode) of a raw frame or of JPEG bytes.

mod crc32c_fold;
mod digest;
mod resize;
mod thumbnail;
mod turbo;

pub use digest::{Crc32c, Sha256};
pub use resize::{area_resize, fit_long_edge, AreaResizer};
pub use thumbnail::{
    encode_jpeg, thumbnail_dimensions, thumbnail_from_frame, thumbnail_from_jpeg, Frame,
    PixelOrder, Thumbnail, ThumbnailSize, DEFAULT_QUALITY,
};
