//! A sink added the way docs/architecture.md ("Adding a sink") describes: this folder and its
//! `mod` line in `main.rs`, nothing else. It keeps every event of a channel in memory, so that
//! the tests below run the whole bridge with it against the real API server, and check its
//! configuration, plan line, `tail` subscription and AsyncAPI description.

mod asyncapi;
mod settings;
mod sink;
#[cfg(test)]
mod tests;

use sink::recorded;
