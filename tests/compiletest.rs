//! Compile-fail and pass cases for the macros: one case per distinct message, under
//! `tests/ui/<category>/`. The `.stderr` files match the pinned compiler (rust-toolchain.toml);
//! regenerate with `TRYBUILD=overwrite cargo test --test compiletest` after reviewing a change.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/launch_bounds/*.rs");
    t.compile_fail("tests/ui/cluster/*.rs");
    t.compile_fail("tests/ui/signature/*.rs");
    t.compile_fail("tests/ui/persistent/*.rs");
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fused/*.rs");
    t.compile_fail("tests/ui/fused/launch/*.rs");
    t.compile_fail("tests/ui/fused/cluster/*.rs");
    t.compile_fail("tests/ui/fused/scope/*.rs");
    t.compile_fail("tests/ui/fused/smem/*.rs");
    t.compile_fail("tests/ui/fused/dataflow/*.rs");
    t.compile_fail("tests/ui/fused/device_rust/*.rs");
    t.pass("tests/ui/fused/pass/*.rs");
    t.compile_fail("tests/ui/warpgroup/*.rs");
}
