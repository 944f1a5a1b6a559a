//! CIP implicit (class-1) I/O: datagram parse and build, and assembly plans compiled once
//! from the assembly configuration.

pub mod frame;
pub mod plan;
