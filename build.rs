//! Link settings of the bridge's binaries.

fn main() {
    // Relative relocations packed (DT_RELR, glibc 2.36 or later; the image runs on trixie's
    // 2.41): the loader reads far less at start, and those pages no longer stay resident.
    // Measured in docs/benchmarks.md ("Memory").
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo::rerun-if-changed=build.rs");
}
