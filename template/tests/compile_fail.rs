// Misuses the kernel macros reject at compile time, with the message each prints.
#[test]
fn misuses_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
