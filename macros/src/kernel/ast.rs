//! The parsed model of a `#[kernel]`: its attribute arguments and parameters, with the
//! user's spans kept for diagnostics.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{parenthesized, Ident, ItemFn, LitInt, Path, Token, Type};

pub struct Kernel {
    pub item: ItemFn,
    pub launch_bounds: Option<LaunchBounds>,
    pub cluster: Option<Cluster>,
    /// `persistent`: the grid's blocks may wait on each other (`grid::Published`).
    pub persistent: Option<Span>,
    pub krate: Option<Path>,
    pub params: Vec<Param>,
}

pub struct LaunchBounds {
    pub max_threads: Spanned<u32>,
    pub min_blocks: Option<Spanned<u32>>,
}

pub struct Cluster {
    pub dims: [u32; 3],
    pub non_portable: bool,
    pub span: Span,
}

impl Cluster {
    pub fn size(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product()
    }
}

#[derive(Clone, Copy)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

pub struct Param {
    pub ident: Ident,
    /// `mut`, as written: the kernel's body may assign the parameter.
    pub mutability: Option<syn::token::Mut>,
    pub ty: Type,
    pub kind: ParamKind,
}

pub enum ParamKind {
    /// Passed by value.
    Scalar,
    /// `&[T]`: read-only global memory.
    Input(Type),
    /// `Out<T>`: a writable global buffer.
    Output(Type),
    /// `Published<T>`: a global buffer blocks publish and wait for, tile by tile.
    Published(Type),
    /// A type no kernel parameter may have; `valid` says why.
    Unsupported(&'static str),
}

impl Kernel {
    pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
        let item: ItemFn = syn::parse2(item)?;
        let mut kernel = Kernel { item, launch_bounds: None, cluster: None, persistent: None, krate: None, params: Vec::new() };
        let parser = syn::meta::parser(|meta| {
            if meta.path.is_ident("launch_bounds") {
                kernel.launch_bounds = Some(parse_launch_bounds(&meta)?);
                Ok(())
            } else if meta.path.is_ident("cluster") {
                let content;
                parenthesized!(content in meta.input);
                kernel.cluster = Some(parse_cluster(&content, meta.path.get_ident().unwrap().span())?);
                Ok(())
            } else if meta.path.is_ident("persistent") {
                kernel.persistent = Some(meta.path.span());
                Ok(())
            } else if meta.path.is_ident("crate") {
                kernel.krate = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error("unknown kernel argument; expected `launch_bounds(..)`, `cluster(..)`, `persistent` or `crate = path`"))
            }
        });
        syn::parse::Parser::parse2(parser, args)?;
        kernel.params = parse_params(&kernel.item)?;
        Ok(kernel)
    }
}

pub(crate) fn parse_launch_bounds(meta: &syn::meta::ParseNestedMeta) -> syn::Result<LaunchBounds> {
    let mut max_threads = None;
    let mut min_blocks = None;
    meta.parse_nested_meta(|nested| {
        let lit: LitInt = nested.value()?.parse()?;
        let value = Spanned { value: lit.base10_parse::<u32>()?, span: lit.span() };
        if nested.path.is_ident("max_threads") {
            max_threads = Some(value);
        } else if nested.path.is_ident("min_blocks") {
            min_blocks = Some(value);
        } else {
            return Err(nested.error("unknown launch bound; expected `max_threads = N` or `min_blocks = N`"));
        }
        Ok(())
    })?;
    let max_threads = max_threads.ok_or_else(|| {
        meta.error("`launch_bounds` needs `max_threads = N`, e.g. `launch_bounds(max_threads = 256)`")
    })?;
    Ok(LaunchBounds { max_threads, min_blocks })
}

enum ClusterArg {
    Extent(LitInt),
    NonPortable,
}

impl Parse for ClusterArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(LitInt) {
            return Ok(ClusterArg::Extent(input.parse()?));
        }
        let ident: Ident = input.parse()?;
        if ident == "non_portable" {
            Ok(ClusterArg::NonPortable)
        } else {
            Err(syn::Error::new_spanned(
                &ident,
                format!("`{ident}` is neither a cluster extent nor `non_portable`: extents are integer literals (checked at compile time), e.g. `cluster(4)` or `cluster(16, non_portable)`"),
            ))
        }
    }
}

pub(crate) fn parse_cluster(content: ParseStream, span: Span) -> syn::Result<Cluster> {
    let args = Punctuated::<ClusterArg, Token![,]>::parse_terminated(content)?;
    let mut dims = Vec::new();
    let mut non_portable = false;
    for arg in args {
        match arg {
            ClusterArg::Extent(lit) if dims.len() == 3 => {
                return Err(syn::Error::new_spanned(lit, "a cluster has at most three extents (x, y, z)"));
            }
            ClusterArg::Extent(lit) => dims.push(lit.base10_parse::<u32>()?),
            ClusterArg::NonPortable => non_portable = true,
        }
    }
    if dims.is_empty() {
        return Err(syn::Error::new(span, "`cluster` needs its extent, e.g. `cluster(4)` or `cluster(2, 2)`"));
    }
    dims.resize(3, 1);
    Ok(Cluster { dims: [dims[0], dims[1], dims[2]], non_portable, span })
}

fn parse_params(item: &ItemFn) -> syn::Result<Vec<Param>> {
    let mut params = Vec::new();
    for input in &item.sig.inputs {
        let (typed, pat) = named_param(input, "kernel", "x: &[f32]")?;
        let ty = (*typed.ty).clone();
        let kind = classify(&ty);
        params.push(Param { ident: pat.ident.clone(), mutability: pat.mutability, ty, kind });
    }
    Ok(params)
}

/// `input`, a parameter of a `what` (a kernel, a stage), with its name: plain (`x` or `mut x`),
/// not `self`, a pattern, a `ref` binding or `x @ ..`. The error shows `example`.
pub(crate) fn named_param<'a>(input: &'a syn::FnArg, what: &str, example: &str) -> syn::Result<(&'a syn::PatType, &'a syn::PatIdent)> {
    let syn::FnArg::Typed(typed) = input else {
        return Err(syn::Error::new_spanned(input, format!("a {what} cannot take `self`; make it a free function")));
    };
    match &*typed.pat {
        syn::Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => Ok((typed, pat)),
        pat => Err(syn::Error::new_spanned(pat, format!("{what} parameters must be plain names (`mut` allowed), e.g. `{example}`"))),
    }
}

/// Every identifier in `tokens`, inside groups too.
pub(crate) fn idents(tokens: TokenStream) -> Vec<Ident> {
    tokens
        .into_iter()
        .flat_map(|tree| match tree {
            TokenTree::Ident(ident) => vec![ident],
            TokenTree::Group(group) => idents(group.stream()),
            _ => Vec::new(),
        })
        .collect()
}

/// `ty` without the invisible group a `macro_rules!` `$t:ty` wraps it in, or parentheses.
pub(crate) fn ungrouped(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ungrouped(&group.elem),
        Type::Paren(paren) => ungrouped(&paren.elem),
        _ => ty,
    }
}

pub(crate) fn classify(ty: &Type) -> ParamKind {
    match ungrouped(ty) {
        Type::Reference(reference) => match (&*reference.elem, reference.mutability) {
            (Type::Slice(slice), None) => ParamKind::Input((*slice.elem).clone()),
            (Type::Slice(_), Some(_)) => ParamKind::Unsupported(
                "a kernel cannot take `&mut [T]`: every thread would hold it; use `Out<T>` for an output buffer",
            ),
            _ => ParamKind::Unsupported("a kernel takes buffers as `&[T]` (input) or `Out<T>` (output), other references are not allowed"),
        },
        Type::Ptr(_) => ParamKind::Unsupported("raw pointers are not kernel parameters; use `&[T]` for inputs and `Out<T>` for outputs"),
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last().expect("a path has a segment");
            let (kind, unsupported): (fn(Type) -> ParamKind, _) = match last.ident.to_string().as_str() {
                "Out" => (ParamKind::Output, "`Out` takes one element type, e.g. `Out<f32>`"),
                "Published" => (ParamKind::Published, "`Published` takes one element type, e.g. `Published<f32>`"),
                _ => return ParamKind::Scalar,
            };
            let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
                return ParamKind::Unsupported(unsupported);
            };
            let mut types = args.args.iter().filter_map(|arg| match arg {
                syn::GenericArgument::Type(ty) => Some(ty.clone()),
                _ => None,
            });
            match (types.next(), types.next()) {
                (Some(elem), None) => kind(elem),
                _ => ParamKind::Unsupported(unsupported),
            }
        }
        Type::Array(_) => ParamKind::Scalar,
        _ => ParamKind::Unsupported("unsupported kernel parameter type; use a scalar, `&[T]` or `Out<T>`"),
    }
}
