//! `#[kernel]`: parse → check → emit.

pub(crate) mod ast;
mod expand;
mod handoffs;
pub(crate) mod valid;

use proc_macro2::TokenStream;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let kernel = match ast::Kernel::parse(args, item.clone()) {
        Ok(kernel) => kernel,
        Err(err) => return expand::fallback(item, err),
    };
    match valid::check(&kernel) {
        Ok(()) => expand::kernel(&kernel),
        Err(err) => expand::fallback(item, err),
    }
}
