//! The parsed model of a `#[fused_kernel]` module: the launch shape, the stages with their
//! scopes and typed ports, and the entry's dataflow of stage calls. Spans are kept for
//! diagnostics; only syntax errors stop the parse.

use crate::kernel::ast::{classify, parse_cluster, named_param, parse_launch_bounds, ungrouped, Cluster, LaunchBounds, ParamKind, Spanned};
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use std::collections::HashMap;
use syn::spanned::Spanned as _;
use syn::{parenthesized, Expr, FnArg, Ident, Item, ItemFn, ItemMod, LitInt, Pat, Path, Stmt, Type};

pub struct Fused {
    pub module: ItemMod,
    pub block: Block,
    pub grid: Expr,
    pub cluster: Option<Cluster>,
    pub launch_bounds: Option<LaunchBounds>,
    pub dynamic_smem: Option<Spanned<u32>>,
    pub krate: Option<Path>,
    /// Items of the module that are neither stages nor the entry: kept as they are.
    pub items: Vec<Item>,
    /// Integer `const`s of the module, for array lengths.
    pub consts: HashMap<String, u64>,
    pub stages: Vec<Stage>,
    pub entry: Entry,
}

/// `block = ..`: threads per block, a constant (checked at compile time) or an expression of
/// `u32` parameters and constants evaluated at launch, e.g. `hidden / 8` (then
/// `launch_bounds(max_threads = N)` bounds it).
pub struct Block {
    pub expr: Expr,
    pub value: Option<Spanned<u32>>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Scope {
    Thread,
    Warp,
    Block,
    Cluster,
    /// Parsed so that it can be rejected with a reason.
    Grid,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Thread => "thread",
            Scope::Warp => "warp",
            Scope::Block => "block",
            Scope::Cluster => "cluster",
            Scope::Grid => "grid",
        }
    }
}

pub struct Stage {
    /// The function with `#[stage]` and `#[out]` removed; its types are still the markers.
    pub item: ItemFn,
    pub scope: Spanned<Scope>,
    pub inputs: Vec<Port>,
    /// `#[out]` parameters (allocated by the kernel), then the returned registers.
    pub outputs: Vec<Port>,
}

impl Stage {
    pub fn name(&self) -> &Ident {
        &self.item.sig.ident
    }
}

/// Where a value lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Space {
    /// Per thread, by value.
    Registers,
    /// The block's own shared memory.
    Shared,
    /// Shared memory of the cluster's blocks, read through DSMEM.
    Dsmem,
    /// A kernel input buffer, `&[T]`.
    GlobalIn,
    /// A kernel output buffer, `Out<T>`.
    GlobalOut,
    /// A launch argument passed by value.
    Uniform,
}

impl Space {
    pub fn name(self) -> &'static str {
        match self {
            Space::Registers => "Registers",
            Space::Shared => "Shared",
            Space::Dsmem => "Dsmem",
            Space::GlobalIn => "Global<&[T]>",
            Space::GlobalOut => "Global<Out<T>>",
            Space::Uniform => "a launch argument",
        }
    }

    pub fn is_shared(self) -> bool {
        matches!(self, Space::Shared | Space::Dsmem)
    }
}

/// One input or output of a stage, or one parameter of the entry.
pub struct Port {
    pub ident: Ident,
    pub space: Space,
    /// The value's type inside the marker: `[f32; 8192]` of `Shared<[f32; 8192]>`, `f16` of
    /// `Global<&[f16]>`.
    pub ty: Type,
    /// The type as written, for spans and messages.
    pub written: Type,
    /// Why the type is not allowed here, if it is not.
    pub invalid: Option<&'static str>,
}

pub struct Entry {
    pub item: ItemFn,
    pub params: Vec<Port>,
    pub steps: Vec<Step>,
    /// Statements that are not stage calls.
    pub strays: Vec<Stmt>,
}

/// `let (a, b) = stage(x, y);` or `stage(x, y);`.
pub struct Step {
    pub stage: Ident,
    pub args: Vec<Arg>,
    pub binds: Vec<Ident>,
    pub span: Span,
}

pub enum Arg {
    Name(Ident),
    /// Not a plain name.
    Other(Expr),
}

impl Fused {
    pub fn parse(args: TokenStream, item: TokenStream) -> syn::Result<Self> {
        let module: ItemMod = syn::parse2(item)?;
        let (mut block, mut grid, mut cluster, mut launch_bounds, mut dynamic_smem, mut krate) = (None, None, None, None, None, None);
        let parser = syn::meta::parser(|meta| {
            if meta.path.is_ident("block") {
                block = Some(meta.value()?.parse::<Expr>()?);
            } else if meta.path.is_ident("grid") {
                grid = Some(meta.value()?.parse::<Expr>()?);
            } else if meta.path.is_ident("cluster") {
                let content;
                parenthesized!(content in meta.input);
                cluster = Some(parse_cluster(&content, meta.path.span())?);
            } else if meta.path.is_ident("launch_bounds") {
                launch_bounds = Some(parse_launch_bounds(&meta)?);
            } else if meta.path.is_ident("dynamic_smem") {
                let lit: LitInt = meta.value()?.parse()?;
                dynamic_smem = Some(Spanned { value: lit.base10_parse()?, span: lit.span() });
            } else if meta.path.is_ident("crate") {
                krate = Some(meta.value()?.parse()?);
            } else {
                return Err(meta.error(
                    "unknown fused_kernel argument; expected `grid = ..`, `block = N`, `cluster(..)`, `launch_bounds(..)`, `dynamic_smem = BYTES` or `crate = path`",
                ));
            }
            Ok(())
        });
        syn::parse::Parser::parse2(parser, args)?;
        let span = module.ident.span();
        let block = block.ok_or_else(|| syn::Error::new(span, "`#[fused_kernel]` needs `block = N`, the threads of each block"))?;
        let grid = grid.ok_or_else(|| syn::Error::new(span, "`#[fused_kernel]` needs `grid = ..`, the blocks of the grid, e.g. `grid = rows`"))?;
        let Some((_, content)) = module.content.clone() else {
            return Err(syn::Error::new(span, "`#[fused_kernel]` needs an inline module: `mod name { stages..., pub fn kernel(..) { .. } }`"));
        };

        let (mut items, mut stages, mut entry) = (Vec::new(), Vec::new(), None);
        let mut consts = HashMap::new();
        for item in content {
            match item {
                Item::Fn(f) if f.attrs.iter().any(is_stage) => stages.push(Stage::parse(f)?),
                Item::Fn(f) if f.sig.ident == "kernel" => entry = Some(Entry::parse(f)?),
                Item::Const(c) => {
                    if let Some(v) = eval(&c.expr, &consts) {
                        consts.insert(c.ident.to_string(), v);
                    }
                    items.push(Item::Const(c));
                }
                other => items.push(other),
            }
        }
        let entry = entry.ok_or_else(|| {
            syn::Error::new(span, "a fused kernel module needs `pub fn kernel(..)`: its parameters are the launch arguments, its body the stages' dataflow")
        })?;
        let value = eval(&block, &consts).map(|v| Spanned { value: v.min(u32::MAX as u64) as u32, span: block.span() });
        let block = Block { expr: block, value };
        Ok(Fused { module, block, grid, cluster, launch_bounds, dynamic_smem, krate, items, consts, stages, entry })
    }

    pub fn stage(&self, name: &Ident) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name() == name)
    }
}

impl Stage {
    fn parse(mut item: ItemFn) -> syn::Result<Self> {
        let index = item.attrs.iter().position(is_stage).expect("has #[stage]");
        let attr = item.attrs.remove(index);
        let scope_ident: Ident = attr.parse_args().map_err(|_| {
            syn::Error::new_spanned(&attr, "expected a scope: `#[stage(thread)]`, `#[stage(warp)]`, `#[stage(block)]` or `#[stage(cluster)]`")
        })?;
        let scope = match scope_ident.to_string().as_str() {
            "thread" => Scope::Thread,
            "warp" => Scope::Warp,
            "block" => Scope::Block,
            "cluster" => Scope::Cluster,
            "grid" => Scope::Grid,
            _ => {
                return Err(syn::Error::new_spanned(
                    scope_ident,
                    "unknown stage scope; expected `thread`, `warp`, `block` or `cluster`",
                ))
            }
        };
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for input in &item.sig.inputs {
            let (typed, pat) = named_param(input, "stage", "row: Shared<[f32; 1024]>")?;
            let mut port = Port::marked(pat.ident.clone(), &typed.ty);
            if typed.attrs.iter().any(is_out) {
                if !port.space.is_shared() {
                    port.invalid = Some("only `Shared<[T; N]>` and `Dsmem<[T; N]>` are `#[out]` parameters (the kernel allocates them); return registers, and write global outputs through `Global<Out<T>>` inputs");
                }
                outputs.push(port);
            } else {
                inputs.push(port);
            }
        }
        // `#[out]` is the macro's own: the stage function keeps its parameters' other attributes.
        for input in &mut item.sig.inputs {
            if let FnArg::Typed(typed) = input {
                typed.attrs.retain(|attr| !is_out(attr));
            }
        }
        if let syn::ReturnType::Type(_, ty) = &item.sig.output {
            let returned: Vec<&Type> = match &**ty {
                Type::Tuple(tuple) => tuple.elems.iter().collect(),
                other => vec![other],
            };
            for (i, ty) in returned.into_iter().enumerate() {
                let mut port = Port::marked(Ident::new(&format!("_{i}"), ty.span()), ty);
                if port.space != Space::Registers {
                    port.invalid = Some("a stage returns only `Registers<T>`; make shared outputs `#[out]` parameters and write global outputs through `Global<Out<T>>`");
                }
                outputs.push(port);
            }
        }
        Ok(Stage { item, scope: Spanned { value: scope, span: scope_ident.span() }, inputs, outputs })
    }
}

impl Port {
    /// A stage port: `Registers<T>`, `Shared<[T; N]>`, `Dsmem<[T; N]>`, `Global<&[T]>`,
    /// `Global<Out<T>>`, or an unmarked launch argument.
    fn marked(ident: Ident, written: &Type) -> Self {
        let mut port = Port { ident, space: Space::Uniform, ty: written.clone(), written: written.clone(), invalid: None };
        let Some((marker, inner)) = marker(written) else {
            if !matches!(classify(written), ParamKind::Scalar) {
                port.invalid = Some("say where this buffer lives: `Global<&[T]>` for an input, `Global<Out<T>>` for an output");
            }
            return port;
        };
        port.ty = inner.clone();
        match marker.as_str() {
            "Registers" => port.space = Space::Registers,
            "Shared" | "Dsmem" => {
                port.space = if marker == "Shared" { Space::Shared } else { Space::Dsmem };
                if !matches!(inner, Type::Array(_)) {
                    port.invalid = Some("shared memory holds arrays: write `Shared<[T; N]>` or `Dsmem<[T; N]>`");
                }
            }
            _ => match classify(&inner) {
                ParamKind::Input(elem) => (port.space, port.ty) = (Space::GlobalIn, elem),
                ParamKind::Output(elem) => (port.space, port.ty) = (Space::GlobalOut, elem),
                _ => port.invalid = Some("global memory is a kernel buffer: `Global<&[T]>` (input) or `Global<Out<T>>` (output)"),
            },
        }
        port
    }

    /// An entry parameter, classified as `#[kernel]` does.
    fn entry(ident: Ident, ty: &Type) -> Self {
        let mut port = Port { ident, space: Space::Uniform, ty: ty.clone(), written: ty.clone(), invalid: None };
        match classify(ty) {
            ParamKind::Scalar => {}
            ParamKind::Input(elem) => (port.space, port.ty) = (Space::GlobalIn, elem),
            ParamKind::Output(elem) => (port.space, port.ty) = (Space::GlobalOut, elem),
            ParamKind::Published(_) => {
                port.invalid = Some("a `Published` buffer (blocks waiting on each other) is a parameter of `#[kernel(persistent, ..)]`; fused kernels have no grid-scope stages")
            }
            ParamKind::Unsupported(why) => port.invalid = Some(why),
        }
        port
    }
}

/// `#[stage(..)]`, or a path to it (`#[clusterfuse::stage(..)]`).
fn is_stage(attr: &syn::Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "stage")
}

/// `#[out]`, on a stage parameter the stage writes.
fn is_out(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("out")
}

/// `Marker<Inner>` for the four memory-space markers.
fn marker(ty: &Type) -> Option<(String, Type)> {
    let Type::Path(path) = ungrouped(ty) else { return None };
    let last = path.path.segments.last()?;
    let name = last.ident.to_string();
    if !matches!(name.as_str(), "Registers" | "Shared" | "Dsmem" | "Global") {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    match args.args.first()? {
        syn::GenericArgument::Type(inner) if args.args.len() == 1 => Some((name, ungrouped(inner).clone())),
        _ => None,
    }
}

impl Entry {
    fn parse(item: ItemFn) -> syn::Result<Self> {
        let mut params = Vec::new();
        for input in &item.sig.inputs {
            let (typed, pat) = named_param(input, "kernel", "x: &[f32]")?;
            params.push(Port::entry(pat.ident.clone(), &typed.ty));
        }
        let (mut steps, mut strays) = (Vec::new(), Vec::new());
        for stmt in &item.block.stmts {
            match Step::parse(stmt) {
                Some(step) => steps.push(step),
                None => strays.push(stmt.clone()),
            }
        }
        Ok(Entry { item, params, steps, strays })
    }
}

impl Step {
    fn parse(stmt: &Stmt) -> Option<Self> {
        let (binds, expr) = match stmt {
            Stmt::Local(local) => {
                let init = local.init.as_ref().filter(|i| i.diverge.is_none())?;
                (pattern(&local.pat)?, &*init.expr)
            }
            Stmt::Expr(expr, Some(_)) => (Vec::new(), expr),
            _ => return None,
        };
        let Expr::Call(call) = expr else { return None };
        let Expr::Path(func) = &*call.func else { return None };
        let stage = func.path.get_ident()?.clone();
        let args = call
            .args
            .iter()
            .map(|arg| match arg {
                Expr::Path(p) if p.path.get_ident().is_some() => Arg::Name(p.path.get_ident().unwrap().clone()),
                other => Arg::Other(other.clone()),
            })
            .collect();
        Some(Step { stage, args, binds, span: stmt.span() })
    }
}

fn pattern(pat: &Pat) -> Option<Vec<Ident>> {
    match pat {
        Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none() && p.mutability.is_none() => Some(vec![p.ident.clone()]),
        Pat::Tuple(t) => t.elems.iter().map(|p| pattern(p).filter(|v| v.len() == 1).map(|mut v| v.remove(0))).collect(),
        _ => None,
    }
}

/// An integer expression of literals and module `const`s: `8192`, `HIDDEN`, `ROWS * 4`.
pub fn eval(expr: &Expr, consts: &HashMap<String, u64>) -> Option<u64> {
    match expr {
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(lit), .. }) => lit.base10_parse().ok(),
        Expr::Path(p) => consts.get(&p.path.get_ident()?.to_string()).copied(),
        Expr::Paren(p) => eval(&p.expr, consts),
        Expr::Group(g) => eval(&g.expr, consts),
        Expr::Binary(b) => {
            let (l, r) = (eval(&b.left, consts)?, eval(&b.right, consts)?);
            match b.op {
                syn::BinOp::Mul(_) => l.checked_mul(r),
                syn::BinOp::Add(_) => l.checked_add(r),
                syn::BinOp::Sub(_) => l.checked_sub(r),
                syn::BinOp::Div(_) if r != 0 => Some(l / r),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Bytes of `ty` when it is a primitive or an array of them with a known length.
pub fn size_of(ty: &Type, consts: &HashMap<String, u64>) -> Option<u64> {
    match ungrouped(ty) {
        Type::Array(array) => size_of(&array.elem, consts)?.checked_mul(eval(&array.len, consts)?),
        Type::Path(p) => match p.path.get_ident()?.to_string().as_str() {
            "u8" | "i8" | "bool" => Some(1),
            "u16" | "i16" | "f16" | "bf16" => Some(2),
            "u32" | "i32" | "f32" => Some(4),
            "u64" | "i64" | "f64" | "usize" | "isize" => Some(8),
            _ => None,
        },
        _ => None,
    }
}

/// The type's tokens without spacing, for comparing two written types.
pub fn text(ty: &Type) -> String {
    ty.to_token_stream().to_string().replace(' ', "")
}

/// The names a grid expression refers to: `rows` in `rows * 2`.
pub fn grid_names(expr: &Expr) -> Vec<Ident> {
    match expr {
        Expr::Path(p) => p.path.get_ident().cloned().into_iter().collect(),
        Expr::Paren(p) => grid_names(&p.expr),
        Expr::Binary(b) => grid_names(&b.left).into_iter().chain(grid_names(&b.right)).collect(),
        _ => Vec::new(),
    }
}
