//! Compile-fail and pass cases for the macros: one case per distinct message, under
//! `tests/ui/<category>/`. The `.stderr` files match the pinned compiler (rust-toolchain.toml);
//! regenerate with `TRYBUILD=overwrite cargo test --test compiletest` after reviewing a change.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/launch_bounds/*.rs");
    t.compile_fail("tests/ui/cluster/*.rs");
    t.compile_fail("tests/ui/signature/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
