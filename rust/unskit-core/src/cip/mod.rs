//! CIP implicit (class-1) I/O: datagram parse and build, assembly plans compiled once
//! from the assembly configuration, and the elementary type table both use.

pub mod connection;
pub mod frame;
pub mod io;
pub mod plan;
pub mod types;
