//! unskit's pure-Rust core: bytes, numbers and frames.
//!
//! Nothing here knows Python, MQTT, files, threads or configuration documents; the
//! `unskit-py` crate binds it to Python and is the only crate that sees Python types.

pub mod cip;
pub mod envelope;
pub mod error;
pub mod image;
pub mod journal;
pub mod signal;
pub mod tls;

pub use error::CoreError;
