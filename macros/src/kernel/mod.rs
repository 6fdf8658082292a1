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

#[cfg(test)]
mod tests {
    use quote::quote;

    /// The device entry (only the nvptx64 build compiles it) keeps the parameters' `mut`.
    #[test]
    fn the_device_entry_keeps_mut_parameters() {
        let text = super::expand(quote!(), quote!(pub fn k(mut n: u32, mut x: &[f32], y: Out<f32>) { n += 1; x = &x[1..]; })).to_string();
        let entry = text.split("extern \"ptx-kernel\" fn k").nth(1).expect("a device entry");
        assert!(entry.starts_with(" (mut n : u32 ,"), "{entry}");
        assert!(entry.contains("let mut x : & [f32] ="), "{entry}");
        assert!(entry.contains("let y : Out < f32 > ="), "{entry}");
    }

    #[test]
    fn ref_patterns_are_refused() {
        let text = super::expand(quote!(), quote!(pub fn k(ref n: u32) {})).to_string();
        assert!(text.contains("kernel parameters must be plain names"), "{text}");
    }
}
