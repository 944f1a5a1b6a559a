//! The values the builder stamps: a random UUID and the current time.

use std::time::{SystemTime, UNIX_EPOCH};

/// A random (version 4) UUID in its hyphenated lowercase form.
pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

/// Milliseconds since the Unix epoch; 0 if the clock is set before it.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
