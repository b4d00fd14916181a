//! What the compiler says when a stack is wired wrong, and that wiring it
//! right compiles.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("fail/*.rs");
    cases.pass("pass/*.rs");
}
