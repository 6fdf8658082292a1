//! `#[cluster_primitive(shared(name: [T; N]), barriers = B)]`: a user-written collective over
//! the blocks of a cluster. Parse (`ast`) → check (`valid`) → emit (`expand`).
//!
//! What it does, and all it does:
//! - requires the function to take the scope token `&Cluster` first, so that every call of a
//!   collective is visibly one (`argmax(&scope, data)`);
//! - gives the body its scratch: `shared(name: [T; N])` binds `name: SharedSlice<T>`, a static
//!   shared array of the primitive (one per block, shared by its calls, counted in the static
//!   shared memory of every kernel that calls it, so the launcher's limit checks include it);
//! - publishes `<name>::FACTS` (a `cluster::PrimitiveFacts`: scratch bytes, declared
//!   barriers) to the device and the host.
//!
//! It cannot check that the body performs the barriers it declares, nor that every block
//! calls it: those are the author's and the caller's promises.

use proc_macro2::TokenStream;

pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let primitive = match ast::Primitive::parse(args, item.clone()) {
        Ok(primitive) => primitive,
        Err(err) => return expand::fallback(item, err),
    };
    match valid::check(&primitive) {
        Ok(()) => expand::primitive(&primitive),
        Err(err) => expand::fallback(item, err),
    }
}

mod ast {
    use proc_macro2::TokenStream;
    use syn::{parenthesized, Ident, ItemFn, LitInt, Path, Token, TypeArray};

    pub struct Primitive {
        pub item: ItemFn,
        pub shared: Option<Scratch>,
        pub barriers: u32,
        pub krate: Option<Path>,
    }

    /// `shared(name: [T; N])`.
    pub struct Scratch {
        pub name: Ident,
        pub ty: TypeArray,
    }

    impl Primitive {
        pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
            let item: ItemFn = syn::parse2(item)?;
            let (mut shared, mut barriers, mut krate) = (None, None, None);
            let parser = syn::meta::parser(|meta| {
                if meta.path.is_ident("shared") {
                    let content;
                    parenthesized!(content in meta.input);
                    let name: Ident = content.parse()?;
                    content.parse::<Token![:]>()?;
                    let ty: syn::Type = content.parse()?;
                    let syn::Type::Array(ty) = ty else {
                        return Err(syn::Error::new_spanned(ty, "the shared scratch is an array, e.g. `shared(scratch: [f32; 64])`"));
                    };
                    shared = Some(Scratch { name, ty });
                    Ok(())
                } else if meta.path.is_ident("barriers") {
                    barriers = Some(meta.value()?.parse::<LitInt>()?.base10_parse::<u32>()?);
                    Ok(())
                } else if meta.path.is_ident("crate") {
                    krate = Some(meta.value()?.parse()?);
                    Ok(())
                } else {
                    Err(meta.error("unknown cluster_primitive argument; expected `shared(name: [T; N])`, `barriers = N` or `crate = path`"))
                }
            });
            syn::parse::Parser::parse2(parser, args)?;
            let barriers = barriers.ok_or_else(|| {
                syn::Error::new_spanned(&item.sig.ident, "`cluster_primitive` needs `barriers = N`: the cluster barriers one call performs, e.g. `#[cluster_primitive(barriers = 2)]`")
            })?;
            Ok(Primitive { item, shared, barriers, krate })
        }
    }
}

mod valid {
    use super::ast::Primitive;
    use crate::kernel::ast::{idents, ungrouped};
    use quote::ToTokens;
    use syn::{Error, FnArg, GenericParam, Type};

    pub fn check(primitive: &Primitive) -> syn::Result<()> {
        let mut errors: Option<Error> = None;
        let mut push = |err: Error| match &mut errors {
            Some(first) => first.combine(err),
            None => errors = Some(err),
        };
        let sig = &primitive.item.sig;
        if !sig.inputs.first().is_some_and(takes_cluster_token) {
            let message = format!(
                "a cluster primitive takes the cluster scope token first, e.g. `fn {}(scope: &cluster::Cluster, ..)`: every block of the cluster must call it",
                sig.ident
            );
            match sig.inputs.first() {
                Some(first) => push(Error::new_spanned(first, message)),
                None => push(Error::new_spanned(&sig.ident, message)),
            }
        }
        if let Some(scratch) = &primitive.shared {
            // The scratch is bound before the body: a parameter of its name would be shadowed.
            let named = |arg: &FnArg| matches!(arg, FnArg::Typed(t) if matches!(&*t.pat, syn::Pat::Ident(p) if p.ident == scratch.name));
            if let Some(param) = sig.inputs.iter().find(|arg| named(arg)) {
                push(Error::new_spanned(param, format!("the shared scratch is named `{}` too, and would hide this parameter in the body; rename one of them", scratch.name)));
            }
            let generics: Vec<_> = sig
                .generics
                .params
                .iter()
                .filter_map(|p| match p {
                    GenericParam::Type(t) => Some(&t.ident),
                    GenericParam::Const(c) => Some(&c.ident),
                    GenericParam::Lifetime(_) => None,
                })
                .collect();
            let used = idents(scratch.ty.to_token_stream());
            if let Some(generic) = generics.iter().find(|g| used.iter().any(|u| u == **g)) {
                push(Error::new_spanned(
                    &scratch.ty,
                    format!(
                        "the shared scratch cannot use the function's generic parameter `{generic}`: it is one static array per primitive; give it a concrete type and length"
                    ),
                ));
            }
        }
        errors.map_or(Ok(()), Err)
    }

    fn takes_cluster_token(arg: &FnArg) -> bool {
        let FnArg::Typed(typed) = arg else { return false };
        let Type::Reference(reference) = ungrouped(&typed.ty) else { return false };
        let Type::Path(path) = ungrouped(&reference.elem) else { return false };
        reference.mutability.is_none() && path.path.segments.last().is_some_and(|s| s.ident == "Cluster")
    }

}

mod expand {
    use super::ast::Primitive;
    use proc_macro2::TokenStream;
    use quote::quote;

    /// The user's item next to the errors, so that one mistake does not cascade.
    pub fn fallback(item: TokenStream, err: syn::Error) -> TokenStream {
        let err = err.to_compile_error();
        quote! {
            #err
            #item
        }
    }

    pub fn primitive(primitive: &Primitive) -> TokenStream {
        let krate = match &primitive.krate {
            Some(path) => quote!(#path),
            None => quote!(::clusterfuse),
        };
        let item = &primitive.item;
        let (attrs, vis, sig, body) = (&item.attrs, &item.vis, &item.sig, &item.block);
        let name = &sig.ident;
        let name_str = name.to_string();
        let doc = format!("What `#[cluster_primitive]` declared for `{name_str}`.");
        let barriers = primitive.barriers;
        let (scratch, shared_bytes) = match &primitive.shared {
            Some(scratch) => {
                let (ident, ty, elem) = (&scratch.name, &scratch.ty, &scratch.ty.elem);
                (
                    quote!(let #ident: #krate::shared::SharedSlice<#elem> = #krate::shared!(#ty);),
                    quote!(::core::mem::size_of::<#ty>()),
                )
            }
            None => (quote!(), quote!(0)),
        };
        quote! {
            #(#attrs)*
            #[inline(always)]
            #vis #sig {
                #scratch
                #body
            }

            #[doc = #doc]
            #vis mod #name {
                #[allow(unused_imports)]
                use super::*;

                /// Scratch bytes and cluster barriers per call.
                pub const FACTS: #krate::cluster::PrimitiveFacts = #krate::cluster::PrimitiveFacts {
                    name: #name_str,
                    shared_bytes: #shared_bytes,
                    barriers: #barriers,
                };
            }
        }
    }
}
