//! `shared!([T; N])`: a module-scope `.shared` array named after its call site, and a typed
//! view of it. Like a CUDA `__shared__` variable, each call site is one array per block.
//! The facade's `shared!` forwards here as `shared_array!($crate; [T; N])`, so the expansion
//! names the clusterfuse crate however the user's manifest calls it.

use proc_macro2::TokenStream;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use quote::quote;
use syn::spanned::Spanned;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Path, Token, Type, TypeArray};

/// `krate; [T; N]`.
struct Input {
    krate: Path,
    array: TokenStream,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let krate = input.parse()?;
        input.parse::<Token![;]>()?;
        Ok(Self { krate, array: input.parse()? })
    }
}

pub fn expand(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<Input>(input) {
        Ok(input) => input,
        Err(err) => return err.to_compile_error(),
    };
    match syn::parse2::<TypeArray>(input.array.clone()) {
        Ok(array) => array_view(&input.krate, &array),
        Err(_) => syn::Error::new_spanned(input.array, "expected an array type, e.g. `shared!([f32; 256])`").to_compile_error(),
    }
}

fn array_view(krate: &Path, array: &TypeArray) -> TokenStream {
    let elem: &Type = &array.elem;
    let len: &Expr = &array.len;
    let symbol = symbol_name(array.span());
    let declare = format!(".shared .align 16 .b8 {symbol}[{{bytes}}];");
    let address = format!("mov.u32 {{addr}}, {symbol};");
    quote! {{
        // `global_asm!` is an item, so it sits in a module of its own.
        #[cfg(target_arch = "nvptx64")]
        #[allow(unused_imports)]
        mod __clusterfuse_shared_array {
            use super::*;
            ::core::arch::global_asm!(#declare, bytes = const ::core::mem::size_of::<[#elem; #len]>());
        }
        #[cfg(target_arch = "nvptx64")]
        let addr: u32 = {
            let addr: u32;
            // SAFETY: reads the address of the array declared just above.
            unsafe { ::core::arch::asm!(#address, addr = out(reg32) addr, options(pure, nomem, nostack)) };
            addr
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let addr: u32 = {
            static SITE: u8 = 0;
            #krate::arch::static_shared_address(&SITE, ::core::mem::size_of::<[#elem; #len]>())
        };
        // SAFETY: the symbol is a 16-byte-aligned `.shared` array of `len` elements, used by
        // this call site alone.
        unsafe { #krate::__private::SharedSlice::<#elem>::from_raw_parts(addr, #len) }
    }}
}

/// A PTX identifier unique to the call site: crate, file, line and column, made unique in
/// the crate ([`unique`]).
fn symbol_name(span: proc_macro2::Span) -> String {
    let crate_name = std::env::var("CARGO_CRATE_NAME").unwrap_or_default();
    let site = span.unwrap();
    let file: String = site.file().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    unique(format!("__clusterfuse_smem_{crate_name}_{file}_{}_{}", site.line(), site.column()))
}

/// `name`, or where this compilation already gave it out, `name` with a count: every
/// expansion of one `macro_rules!` that calls `shared!` has the macro's span, and two
/// `.shared` arrays of one name are a PTX error. (The compiler loads the macro crate once per
/// crate it compiles, and expands in a fixed order.)
fn unique(name: String) -> String {
    static GIVEN: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(Mutex::default);
    let mut given = GIVEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let count = given.entry(name.clone()).or_insert(0);
    *count += 1;
    if *count == 1 { name } else { format!("{name}_{count}") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_given_twice_gets_a_count() {
        let name = || "__clusterfuse_smem_test_a_rs_1_2".to_string();
        assert_eq!(super::unique(name()), name());
        assert_eq!(super::unique(name()), format!("{}_2", name()));
        assert_eq!(super::unique(name()), format!("{}_3", name()));
    }
}
