//! `#[fused_kernel]`: parse the module (`ast`) → scan bodies (`scan`) → check the fusion
//! plan (`check`) → emit plain device code and one `#[kernel]` (`expand`).

mod ast;
mod check;
mod expand;
mod scan;

use proc_macro2::TokenStream;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let fused = match ast::Fused::parse(args, item) {
        Ok(fused) => fused,
        Err(err) => return err.to_compile_error(),
    };
    match check::check(&fused) {
        Ok(()) => expand::fused(&fused),
        Err(err) => expand::fallback(&fused, err),
    }
}
